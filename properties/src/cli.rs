//! What the `logprobe` binary prints: stdout that ends quietly when the
//! reader goes away (`| head`), and the long help of `verify`, whose tensor
//! and metadata names come from the format's name table
//! ([`logprobe_verify::names`]).

use std::io::Write;

use logprobe_verify::names::{built, Kind, NAMES};

/// Stdout for reports. A closed pipe (`EPIPE`) is not an error of the
/// verification: once a write fails, later writes are dropped and the exit
/// status stays the verification's.
pub struct Out {
    closed: bool,
}

impl Out {
    /// Stdout, open.
    pub fn new() -> Self {
        Out { closed: false }
    }

    /// Writes `s` and flushes; drops it when stdout is closed.
    pub fn print(&mut self, s: &str) {
        if self.closed {
            return;
        }
        let mut lock = std::io::stdout().lock();
        if lock
            .write_all(s.as_bytes())
            .and_then(|_| lock.flush())
            .is_err()
        {
            self.closed = true;
        }
    }
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

/// The text after `logprobe verify --help`: exit codes, the names a dump may
/// hold, what the report's columns mean.
pub fn verify_help() -> String {
    let tensors: Vec<&str> = built(Kind::Tensor, NAMES).collect();
    let keys: Vec<&str> = built(Kind::Meta, NAMES).collect();
    format!(
        "\
Exit status:
  0  every output of every file within its bound (with --expect: every verdict as expected)
  1  some output beyond its bound, or \"no bound\" (the model certifies nothing)
  2  bad input (the message names the tensor / key, row and column)

Tensor names: {}
Metadata keys (strings): {}
  ([B, T, V] logits take [B, T] per-row tensors; row_mask, cotangent_reduction,
  topk_ids_source and topk_sorted need format_version=\"2\"; any other name is bad input)

Columns of the report:
  max |err|   largest upper bound on |candidate - exact| (nats; per logit for grad_logits)
  max ulps    the same in ulps of the candidate's dtype at the exact value
  err/bound   largest error / bound under --model (<= 1 passes)
  tightest    the tightest of tree, lanes=8, sequential whose bound every element meets
              (how far the candidate is from what a better summation achieves)
  flash       the flash-attention rule: max error / max(naive same-dtype error, half ulp);
              reported alongside, not required (<= 2 holds)
  unchecked   the output had no element to check (N = 0, every row ignored, K = 0)

A huge `max ulps` can sit next to \"pass\": gradients are judged absolutely
(the bound scales with the row's largest terms), so an element whose exact value
is near 0 has a tiny ulp and a correct candidate many ulps away.",
        tensors.join(", "),
        keys.join(", ")
    )
}
