"""kiln.base, as mxnet.base: MXNetError, the base class of every kiln error (kiln.KilnError), so
MXNet code such as d2lzh's try_gpu (`except mx.base.MXNetError:`) catches kiln's errors."""
from ._C import KilnError as MXNetError

__all__ = ["MXNetError"]
