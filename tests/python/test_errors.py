"""Typed C++ errors become Python exceptions of the matching class, carrying the C++ message; errors
of queued tasks surface at the next sync point (wait_to_read, asnumpy, item, waitall) naming the op."""
import numpy as np
import pytest

import kiln
from kiln import autograd, nd


@pytest.fixture(autouse=True)
def _clean_engine():
    # waitall rethrows the first task error since the previous waitall: start and end with none.
    try:
        kiln.waitall()
    except kiln.KilnError:
        pass
    yield
    try:
        kiln.waitall()
    except kiln.KilnError:
        pass


@pytest.mark.parametrize("cls,bases", [
    (kiln.ShapeError, (ValueError,)), (kiln.DTypeError, (TypeError,)), (kiln.DeviceError, (ValueError,)),
    (kiln.FormatError, (ValueError,)), (kiln.ArgumentError, (ValueError,)), (kiln.StateError, (RuntimeError,)),
    (kiln.OutOfMemoryError, (MemoryError,)), (kiln.InternalError, (RuntimeError,)),
    (kiln.KilnError, (Exception,))])
def test_exception_classes(cls, bases):
    assert cls.__module__ == "kiln"
    for base in bases:
        assert issubclass(cls, base)


def test_shape_error_is_value_error_with_message():
    with pytest.raises(ValueError) as info:
        nd.ones((2, 3)) + nd.ones((4,))
    assert type(info.value) is kiln.ShapeError
    assert "add: shapes (2, 3) and (4,) do not broadcast" in str(info.value)
    with pytest.raises(kiln.ShapeError, match="reshape"):
        nd.ones((2, 3)).reshape(4, 2)


def test_dtype_error_is_type_error():
    with pytest.raises(TypeError) as info:
        nd.ones((2,)).astype("int8")
    assert type(info.value) is kiln.DTypeError
    assert "unknown dtype 'int8'" in str(info.value) and "float32" in str(info.value)
    b = nd.array([True, False])
    with pytest.raises(kiln.DTypeError, match="pow: not defined for bool"):
        b ** b  # raised through the operator fast path, too


def test_device_error_is_value_error():
    if kiln.num_gpus() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError) as info:
        nd.ones((2,), device=kiln.gpu(0))
    assert type(info.value) is kiln.DeviceError
    # With CUDA built but no GPU: "does not exist"; built without CUDA: "not available".
    msg = str(info.value)
    assert ("gpu(0) does not exist" in msg or "gpu(0) is not available" in msg) and "kiln.cpu()" in msg


def test_argument_state_and_memory_errors():
    x = nd.ones((2,))
    with pytest.raises(kiln.ArgumentError, match="grad_req must be"):
        x.attach_grad("sometimes")
    with pytest.raises(kiln.ArgumentError, match="unknown op 'no_such_op'"):
        nd.invoke("no_such_op", [])
    x.attach_grad()
    with autograd.record():
        y = (x * 2).sum()
    y.backward()
    with pytest.raises(kiln.StateError, match="already freed"):
        y.backward()
    with pytest.raises(MemoryError) as info:
        nd.zeros((2**45,))
    assert type(info.value) is kiln.OutOfMemoryError and "bytes" in str(info.value)


def test_item_of_many_elements():
    with pytest.raises(kiln.ShapeError, match="exactly one"):
        nd.ones((3,)).item()


# ---- errors inside queued tasks ----

def _failing_take():
    # Index checks run in the kernel, on an engine worker: the call itself returns at once.
    return nd.take(nd.arange(5), nd.array(np.array([0, 7])))


@pytest.mark.parametrize("sync", ["wait_to_read", "asnumpy", "item_of_sum", "waitall"])
def test_task_errors_surface_at_sync_points(sync):
    y = _failing_take()
    with pytest.raises(kiln.ArgumentError) as info:
        if sync == "waitall":
            kiln.waitall()
        elif sync == "item_of_sum":
            y.sum().item()  # the error flows on through the ops that read y
        else:
            getattr(y, sync)()
    msg = str(info.value)
    assert "operator 'take'" in msg and "index 7" in msg and "out of range" in msg


def test_task_error_flows_through_operators():
    y = _failing_take() + 1  # fast-path operator on a failed input: queued, not raised
    with pytest.raises(kiln.ArgumentError, match="take"):
        y.asnumpy()


def test_task_error_in_random_op():
    y = nd.random.bernoulli(2.0, shape=(3,))
    with pytest.raises(kiln.ArgumentError, match="random_bernoulli: p must be in \\[0, 1\\]"):
        y.asnumpy()


def test_error_raised_at_a_sync_point_does_not_resurface_in_a_later_waitall():
    # Two unrelated parts, as two tests in one process: the first catches its ops' errors where it
    # syncs (and drops the arrays); the second part's waitall must not raise them again.
    with pytest.raises(kiln.ArgumentError, match="take"):
        _failing_take().asnumpy()
    with pytest.raises(kiln.ArgumentError, match="random_bernoulli"):
        nd.random.bernoulli(1.5, shape=(4,)).wait_to_read()
    y = nd.ones((2,)) + 1
    kiln.waitall()
    assert y.asnumpy().tolist() == [2.0, 2.0]
    # An error that no sync point has raised is still reported by waitall, once.
    _failing_take()
    with pytest.raises(kiln.ArgumentError, match="take"):
        kiln.waitall()
    kiln.waitall()


def test_errors_from_dlpack_export_of_failed_array():
    y = _failing_take()
    with pytest.raises(kiln.ArgumentError, match="take"):
        y.__dlpack__()
