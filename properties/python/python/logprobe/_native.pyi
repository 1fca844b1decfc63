# The Rust extension (properties/python/src/lib.rs). Use `logprobe.verify`.
from typing import Any, Callable, List, Optional, Tuple, Union

class BadInputError(ValueError): ...

TENSOR_KEYWORDS: List[str]
METADATA_KEYWORDS: List[str]
DEFAULT_STATISTICAL_C: float
__version__: str
DEFAULT_REQUIRE: str

def verify(
    tensors: List[Tuple[str, Any, Optional[str], bool]],
    metadata: List[Tuple[str, str]],
    *,
    name: str,
    model: str,
    accumulation: Optional[str] = None,
    rows: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
    form: str = ...,
    k3_form: str = ...,
) -> Tuple[str, str]: ...
def verify_file(
    path: str,
    *,
    model: str,
    accumulation: Optional[str] = None,
    rows: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
    form: str = ...,
    k3_form: str = ...,
) -> Tuple[str, str]: ...
def verify_files(
    paths: List[str],
    *,
    model: str,
    accumulation: Optional[str] = None,
    rows: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
    form: str = ...,
    k3_form: str = ...,
) -> List[Tuple[str, str]]: ...
def dump_bytes(
    tensors: List[Tuple[str, Any, Optional[str], bool]],
    metadata: List[Tuple[str, str]],
) -> bytes: ...
def generate_weights(
    distribution: str, seed: int, scale: float, v: int, h: int, dtype: str
) -> Tuple[bytearray, List[Tuple[str, str]]]: ...
def closest_name(name: str) -> Optional[str]: ...
def name_kind(name: str) -> Optional[Tuple[str, bool]]: ...
def compare(
    a_tensors: List[Tuple[str, Any, Optional[str], bool]],
    a_metadata: List[Tuple[str, str]],
    b_tensors: List[Tuple[str, Any, Optional[str], bool]],
    b_metadata: List[Tuple[str, str]],
    *,
    name_a: str,
    name_b: str,
    model: str,
    clip: float = 0.2,
    kl: bool = True,
    accumulation: Optional[str] = None,
    rows: Optional[str] = None,
    worst: int = 5,
) -> Tuple[str, str]: ...
def fuzz(
    caller: Callable[[bytes], Union[bytes, Tuple[str, str]]],
    *,
    name: str,
    budget: str,
    cases: Optional[int],
    shrink_budget: str,
    options: str,
    outputs: List[str],
    require: str,
    seed: Optional[int],
    progress: bool,
    bitwise: bool = ...,
    accumulation: Optional[str] = ...,
    strict: bool = ...,
) -> Tuple[str, str, List[Tuple[str, bytes]]]: ...
def fuzz_replay(
    caller: Callable[[bytes], Union[bytes, Tuple[str, str]]],
    path: str,
    *,
    name: str,
    outputs: List[str],
    require: str,
    bitwise: bool = ...,
    accumulation: Optional[str] = ...,
    strict: bool = ...,
) -> Optional[Tuple[str, str, str]]: ...
