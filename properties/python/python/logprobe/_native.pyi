# The Rust extension (properties/python/src/lib.rs). Use `logprobe.verify`.
from typing import Any, List, Optional, Tuple

class BadInputError(ValueError): ...

TENSOR_KEYWORDS: List[str]
METADATA_KEYWORDS: List[str]
DEFAULT_STATISTICAL_C: float
__version__: str

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
) -> Tuple[str, str]: ...
def verify_file(
    path: str,
    *,
    model: str,
    accumulation: Optional[str] = None,
    rows: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
) -> Tuple[str, str]: ...
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
