"""pytest plugin: bridges for gaps of Triton's interpreter, so that the gpu tier runs
mlstm_kernels' and fla's Triton kernels on the CPU (loaded by conftest.py when
``TRITON_INTERPRET=1``; `make test-gpu-interp`). Written against Triton 3.7/3.8's
``triton.runtime.interpreter``; each bridge says what it fixes.

1. **bfloat16.** The interpreter keeps bfloat16 values as their raw 16-bit patterns in uint16
   arrays, and its arithmetic, ``tl.dot``, sums and cumsums then run on the integers; float32 →
   bfloat16 truncates. Here bfloat16 values live in float32 arrays instead, rounded to bfloat16
   (to nearest even) wherever Triton rounds: at a cast, after each bfloat16 operation, at a
   store; loads and stores convert from and to the 16-bit patterns in memory.
2. **Loop indices.** A compiled kernel's ``for i in range(n)`` gives ``i`` as a Triton int32
   value, the interpreter a Python int, so ``i.to(tl.int64)`` (fla) fails: loop indices become
   int32 scalar tensors (``tl.static_range`` loops keep Python ints, as compiled).
3. **tl.flip** runs its bitcast-and-xor network element by element in Python (an SX model test
   took minutes): it becomes numpy's flip, the same values.
4. **The autotuner** asks the active driver for a benchmarker and the target, and the interpreter
   has none ("0 active drivers"): it is given a driver that reports the interpreter and a
   benchmarker that times nothing (every configuration is correct, one is as good as another).
"""

from __future__ import annotations

import ast

import numpy as np
import pytest
import triton
import triton.language as tl
from triton.runtime import interpreter as ti

_BF16 = tl.bfloat16


def _is_bf16(dtype) -> bool:
    dtype = getattr(dtype, "scalar", dtype)
    return dtype == _BF16


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), kept in float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(x), x, out)


def _trunc_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 toward zero (Triton's rounding mode RTZ)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def _bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bits(x: np.ndarray) -> np.ndarray:
    return (_round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


# ------------------------------------------------------------------------------ 1. bfloat16

_orig_np_dtype = ti._get_np_dtype
_orig_validate = ti._validate_np_data_size


def _np_dtype(tt_dtype):
    if not isinstance(tt_dtype, tl.pointer_type) and _is_bf16(
        tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
    ):
        return np.dtype(np.float32)
    return _orig_np_dtype(tt_dtype)


def _validate(np_array, tl_dtype):
    if not isinstance(tl_dtype, tl.pointer_type) and _is_bf16(tl_dtype):
        return np_array.dtype == np.float32
    return _orig_validate(np_array, tl_dtype)


B = ti.InterpreterBuilder
_orig = {
    name: getattr(B, name)
    for name in (
        "create_masked_load",
        "create_masked_store",
        "cast_impl",
        "create_fp_to_fp",
        "create_bitcast",
        "binary_op",
        "unary_op",
        "ternary_op",
        "create_fma",
        "create_fabs",
    )
}


def _masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
    dtype_tt = ptrs.get_element_ty()
    if not _is_bf16(dtype_tt):
        return _orig["create_masked_load"](
            self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile
        )
    other_bits = (
        np.zeros(ptrs.data.shape, dtype=np.uint16)
        if other is None
        else np.broadcast_to(_f32_to_bits(other.data), ptrs.data.shape).copy()
    )
    bits = ti._interpreter.load(ptrs.data, mask.data, other_bits, np.dtype(np.uint16))
    return ti.TensorHandle(_bits_to_f32(bits), dtype_tt)


def _masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
    if _is_bf16(ptrs.get_element_ty()):
        data = np.broadcast_to(value.data, ptrs.data.shape)
        return ti._interpreter.store(ptrs.data, _f32_to_bits(data), mask.data)
    return _orig["create_masked_store"](self, ptrs, value, mask, cache_modifier, eviction_policy)


def _cast(self, src, dst_type):
    s, d = src.dtype.scalar, dst_type.scalar
    if not (_is_bf16(s) or _is_bf16(d)):
        return _orig["cast_impl"](self, src, dst_type)
    data = src.data.astype(np.float32) if not _is_bf16(s) else src.data
    if _is_bf16(d):
        return ti.TensorHandle(_round_bf16(data), d)
    return ti.TensorHandle(data.astype(_np_dtype(d)), d)


def _fp_to_fp(self, src, dst_type, rounding_mode):
    s, d = src.dtype.scalar, dst_type.scalar
    if not (_is_bf16(s) or _is_bf16(d)):
        return _orig["create_fp_to_fp"](self, src, dst_type, rounding_mode)
    data = src.data.astype(np.float32)
    if _is_bf16(d):
        rtz = rounding_mode is not None and rounding_mode == ti._ir.ROUNDING_MODE.RTZ
        return ti.TensorHandle(_trunc_bf16(data) if rtz else _round_bf16(data), d)
    return ti.TensorHandle(data.astype(_np_dtype(d)), d)


def _bitcast(self, src, dst_type):
    s, d = src.dtype.scalar, dst_type.scalar
    if _is_bf16(s) and not _is_bf16(d):  # bfloat16 → 16-bit integer patterns
        return ti.TensorHandle(_f32_to_bits(src.data).view(_np_dtype(d)), d)
    if _is_bf16(d) and not _is_bf16(s):
        return ti.TensorHandle(_bits_to_f32(src.data.view(np.uint16)), d)
    return _orig["create_bitcast"](self, src, dst_type)


def _rounded(handle):
    """A bfloat16 operation's result, rounded as Triton's bfloat16 arithmetic is."""
    if _is_bf16(handle.dtype) and handle.data.dtype.kind == "f":
        handle.data = _round_bf16(handle.data)
    return handle


def _binary(self, lhs, rhs, op):
    return _rounded(_orig["binary_op"](self, lhs, rhs, op))


def _unary(self, arg, op):
    return _rounded(_orig["unary_op"](self, arg, op))


def _ternary(self, lhs, rhs, other, op):
    return _rounded(_orig["ternary_op"](self, lhs, rhs, other, op))


def _fma(self, x, y, z):
    return _rounded(_orig["create_fma"](self, x, y, z))


def _fabs(self, arg):
    if _is_bf16(arg.dtype):
        return ti.TensorHandle(np.abs(arg.data), arg.dtype.scalar)
    return _orig["create_fabs"](self, arg)


# ------------------------------------------------------------------------------ 2. loop indices


def _int32_loop(it):
    """Each index of a kernel's ``range`` loop as an int32 scalar tensor, as compiled."""
    for i in it:
        if isinstance(i, (int, np.integer)):
            yield tl.tensor(ti.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)
        else:
            yield i


class _LoopTransformer(ti.ASTTransformer):
    def visit_For(self, node):
        self.generic_visit(node)
        it = node.iter
        fn = it.func if isinstance(it, ast.Call) else None
        name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
        if name == "range":  # range and tl.range; tl.static_range stays Python ints
            node.iter = ast.Call(ast.Name("_swax_int32_loop", ast.Load()), [it], [])
        return node


# ------------------------------------------------------------------------------ 3. tl.flip


def _flip(x, dim=None, **kwargs):
    axis = len(x.shape) - 1 if dim is None else (dim.value if hasattr(dim, "value") else dim)
    data = np.ascontiguousarray(np.flip(x.handle.data, axis=axis))
    return tl.tensor(ti.TensorHandle(data, x.handle.dtype), x.type)


# ------------------------------------------------------------------------------ 4. autotuner


class _Target:
    # fla names its torch device module after the backend (torch.cpu here)
    backend, arch, warp_size = "cpu", 0, 32


class _InterpreterDriver:
    """What fla's autotuned kernels ask of the active driver under the interpreter."""

    def get_benchmarker(self):
        return lambda fn, *a, **k: [0.0, 0.0, 0.0] if k.get("quantiles") else 0.0

    def get_current_target(self):
        return _Target()

    def get_current_device(self):
        return 0

    def get_device_interface(self):
        import torch

        return torch.cpu

    def get_empty_cache_for_benchmark(self):
        import torch

        return torch.empty(0)

    def clear_cache(self, cache):
        pass


def _install() -> None:
    ti._get_np_dtype = _np_dtype
    ti._validate_np_data_size = _validate
    for name, fn in (
        ("create_masked_load", _masked_load),
        ("create_masked_store", _masked_store),
        ("cast_impl", _cast),
        ("create_fp_to_fp", _fp_to_fp),
        ("create_bitcast", _bitcast),
        ("binary_op", _binary),
        ("unary_op", _unary),
        ("ternary_op", _ternary),
        ("create_fma", _fma),
        ("create_fabs", _fabs),
    ):
        setattr(B, name, fn)
    # the casts are bound at class creation as lambdas calling self.cast_impl: nothing to redo
    ti._swax_int32_loop = _int32_loop  # copied into each kernel's globals by the interpreter
    ti.FunctionRewriter.ast_transformer = _LoopTransformer()
    tl.flip = _flip
    tl.standard.flip = _flip
    driver = triton.runtime.driver
    if driver._active is None and driver._default is None:
        try:
            driver.active  # noqa: B018 - a GPU driver, where there is one
        except RuntimeError:
            driver._default = driver._active = _InterpreterDriver()


_install()


def pytest_configure(config):
    """Under the interpreter without CUDA the tier exists to run the kernels: a kernel backend
    that cannot run (a package missing, a version without what swax calls) is an error here,
    not a quiet pass on the native path."""
    import torch

    from swax.ops.registry import backend_report

    # mlstm_kernels 2.0.6 calls what Triton 3.7 deprecates; fla warns that it found no GPU
    for text in ("tl.make_block_ptr is deprecated", "Triton is not supported on current platform"):
        config.addinivalue_line("filterwarnings", f"ignore:{text}")
    if torch.cuda.is_available():
        return
    kernels = {("mlstm", "triton"), ("gated_delta", "fla")}
    bad = [
        f"{r['op']} backend {r['name']!r}: {r['reason']}"
        for r in backend_report("cpu")
        if (r["op"], r["name"]) in kernels and r["reason"] is not None
    ]
    if bad:
        raise pytest.UsageError("the interpreter tier cannot run: " + "; ".join(bad))
