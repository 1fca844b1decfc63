"""Hostile inputs from Python (issue 43): a shape that promises more rows
than memory holds is bad input before anything is allocated, and a FIFO
that nobody writes is an error after the stream's idle timeout, never a
hang."""

import os
import time

import numpy as np
import pytest

import logprobe


def test_zero_vocabulary_with_2_to_the_40_rows_is_bad_input_at_once():
    logits = np.zeros((2**40, 0), dtype=np.float32)  # no bytes: V = 0
    t0 = time.monotonic()
    with pytest.raises(logprobe.BadInputError, match="logits"):
        logprobe.verify(logits)
    assert time.monotonic() - t0 < 5.0


def test_a_fifo_without_a_writer_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "dump.safetensors"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(logprobe.BadInputError):
        logprobe.verify_file(fifo)
    # The idle timeout is 5 s (STREAM_IDLE_TIMEOUT); well before any hang.
    assert time.monotonic() - t0 < 30.0
