"""NVIDIA's libdevice in simulation: ``libdevice.asin(x)``, ``libdevice.fast_expf(x)``,
``libdevice.fadd_rd(a, b)``... computed as a GPU computes them, for Triton's interpreter
(``triton.language.extra.libdevice``, ``tl.extra.cuda.libdevice``) and Numba's simulator
(``numba.cuda.libdevice``).

On a GPU, both compile these calls into NVIDIA's CUDA math library (``__nv_asinf``,
``__nv_fast_expf``...). The simulators have no such library: Triton's interpreter failed
on every call ("cannot convert None to tensor") and Numba's simulator returned None. Here
each ``__nv_*`` symbol gets a NumPy twin, looked up by the symbol that Triton's dispatch
or Numba's declaration picks from the argument types, so what a GPU accepts (float32 or
float64 for the math functions, int32 for ``popc``...) and refuses stays the same.

How close to the GPU:

* **Math functions** (``sinf``, ``erff``, ``tanhf``...) are computed in float64 and rounded
  once to the result type. libdevice's float32 functions are within 1 to 4 ulp of the true
  value (CUDA C++ Programming Guide, "Mathematical Functions"), these within half an ulp:
  a kernel sees the GPU's value within a few ulp, never a different function.
* **Explicit rounding** (``fadd_rz``, ``fmul_ru``, ``fdiv_rd``, ``fsqrt_rn``, ``fmaf_rn``,
  ``double2float_rd``, ``int2float_ru``...) is exact: the result is the exact value rounded
  in the named direction, as the GPU's instructions do (``fma`` rounds once).
* **Fast approximations** (``fast_expf``, ``fast_logf``, ``fast_powf``, ``fast_fdividef``...)
  follow the formulas of the GPU's SASS, as the CUDA emulator's ``__expf`` does
  (``runtime/backends/cuda/emu/cuda_emu.h``): ``fast_expf(x)`` is ``ex2.approx(x * log2(e))``
  with the product rounded to float32 first, so its error grows with ``|x|`` as on a GPU;
  subnormal inputs and results are flushed to zero.
* **Conversions** to integers saturate, and NaN converts to 0, as ``cvt`` does.
* **Integer helpers** (``popc``, ``clz``, ``brev``, ``byte_perm``, ``mulhi``, ``sad``...) are
  exact.

``jn``/``yn`` (Bessel functions of order n) have no twin here and say so.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["evaluate", "LibdeviceNotSimulated"]

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
LOG2E_F32 = np.float32(1.44269502)
LOG2_10_F32 = np.float32(3.32192802)
LN2_F32 = np.float32(0.693147182)


class LibdeviceNotSimulated(NotImplementedError):
    """A libdevice function that the interpreter cannot compute."""


def _torch_special(name):
    def f(x):
        import torch
        return getattr(torch.special, name)(torch.from_numpy(np.array(x, F64, order="C"))).numpy()
    return f


def _per_element(fn, otype=float):
    """``fn`` on every element (Python's ``math`` has functions NumPy lacks); a ValueError
    (a pole, a domain error) gives NaN, an OverflowError gives an infinity."""
    def g(*xs):
        def one(*v):
            try:
                return fn(*v)
            except ValueError:
                return math.nan
            except OverflowError:
                return math.inf
        return np.frompyfunc(one, len(xs), 1)(*xs).astype(otype)
    return g


def _gamma(x):
    if x == math.floor(x) and x <= 0:
        return math.nan  # the poles: CUDA's tgamma gives NaN at 0, -1, -2 ... (+-inf at +-0)
    return math.gamma(x)


def _lgamma(x):
    if x == math.floor(x) and x <= 0:
        return math.inf  # the poles: CUDA's lgamma gives +inf there
    return math.lgamma(x)


def _tgamma(x):
    x = np.asarray(x, F64)
    out = _per_element(_gamma)(x)
    return np.where(x == 0, np.copysign(np.inf, x), out)


def _round_half_away(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _logb(x):
    _, e = np.frexp(x)
    out = (e - 1).astype(F64)
    out = np.where(np.isinf(x), np.inf, out)
    return np.where(x == 0, -np.inf, np.where(np.isnan(x), x, out))


def _ilogb(x):
    _, e = np.frexp(x)
    out = (e - 1).astype(np.int64)
    out = np.where(np.isinf(x), 2**31 - 1, out)
    return np.where((x == 0) | np.isnan(x), -2**31, out)


def _pi_quadrant(x):
    """x = 2k + n/2 + t with |t| <= 1/4 (every step exact), so that sinpi and cospi are
    exact where they should be: sinpi(1) = 0, cospi(0.5) = 0, not sin(pi * 1) = 1.2e-16."""
    r = x - 2.0 * np.rint(x / 2.0)
    n = np.rint(2.0 * r)
    return (n.astype(np.int64) % 4), np.pi * (r - n / 2.0)


def _sinpi(x):
    n, t = _pi_quadrant(x)
    s, c = np.sin(t), np.cos(t)
    return np.choose(n, [s, c, -s, -c]) + 0.0 * x  # NaN and inf give NaN


def _cospi(x):
    n, t = _pi_quadrant(x)
    s, c = np.sin(t), np.cos(t)
    return np.choose(n, [c, -s, -c, s]) + 0.0  # + 0.0: cospi(0.5) is +0, not -0


def _erfcinv(x):
    return -_torch_special("ndtri")(np.asarray(x, F64) / 2) / math.sqrt(2.0)


def _saturate(x):
    return np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0))


def _fdim(x, y):
    return np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x - y, 0.0))


#: One-argument math functions: computed in float64, rounded once to the result type.
UNARY = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "cbrt": np.cbrt, "ceil": np.ceil, "cos": np.cos,
    "cosh": np.cosh, "cospi": _cospi, "erf": _torch_special("erf"), "erfc": _torch_special("erfc"),
    "erfcinv": _erfcinv, "erfcx": _torch_special("erfcx"), "erfinv": _torch_special("erfinv"),
    "exp": np.exp, "exp10": lambda x: np.power(10.0, x), "exp2": np.exp2, "expm1": np.expm1,
    "fabs": np.abs, "floor": np.floor, "j0": _torch_special("bessel_j0"),
    "j1": _torch_special("bessel_j1"), "y0": _torch_special("bessel_y0"),
    "y1": _torch_special("bessel_y1"), "cyl_bessel_i0": _torch_special("i0"),
    "cyl_bessel_i1": _torch_special("i1"), "lgamma": _per_element(_lgamma),
    "tgamma": _tgamma, "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2,
    "logb": _logb, "nearbyint": np.rint, "rint": np.rint, "round": _round_half_away,
    "trunc": np.trunc, "normcdf": _torch_special("ndtr"), "normcdfinv": _torch_special("ndtri"),
    "rcbrt": lambda x: 1.0 / np.cbrt(x), "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin,
    "sinh": np.sinh, "sinpi": _sinpi, "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "saturate": _saturate, "frsqrt_rn": lambda x: 1.0 / np.sqrt(x),
}

#: Two- and three-argument math functions (float arguments, computed in float64).
MULTI = {
    "atan2": np.arctan2, "copysign": np.copysign, "fdim": _fdim, "fmod": np.fmod,
    "hypot": np.hypot, "rhypot": lambda x, y: 1.0 / np.hypot(x, y), "pow": np.power,
    "remainder": _per_element(math.remainder),
    "norm3d": lambda a, b, c: np.hypot(np.hypot(a, b), c),
    "norm4d": lambda a, b, c, d: np.hypot(np.hypot(a, b), np.hypot(c, d)),
    "rnorm3d": lambda a, b, c: 1.0 / np.hypot(np.hypot(a, b), c),
    "rnorm4d": lambda a, b, c, d: 1.0 / np.hypot(np.hypot(a, b), np.hypot(c, d)),
}


# ---------------------------------------------------------------------------------------
# Exact rounding in a named direction
# ---------------------------------------------------------------------------------------
def _is_even(r, dtype):
    bits = np.array(r, dtype).view(np.uint32 if dtype == F32 else np.uint64)
    return int(bits) % 2 == 0


def _round_exact(q, dtype, mode):
    """The number ``q`` (an exact ``Fraction``, or a float NaN/inf) rounded to ``dtype``:
    ``mode`` is "rn" (nearest, ties to even), "rz" (toward zero), "ru" (up), "rd" (down)."""
    if not isinstance(q, Fraction):
        return dtype.type(q)
    t = dtype.type
    big = Fraction(float(np.finfo(dtype).max))
    if abs(q) > big:  # beyond the largest finite value: infinity or the largest, by direction
        sign = 1 if q > 0 else -1
        to_inf = mode == "rn" or (mode == "ru" and sign > 0) or (mode == "rd" and sign < 0)
        return t(sign * math.inf) if to_inf else t(sign * float(np.finfo(dtype).max))
    r = t(float(q))  # within an ulp of the answer (float(q) rounds once, t() maybe again)
    if Fraction(float(r)) == q:
        return r
    lo, hi = (r, np.nextafter(r, t(math.inf))) if Fraction(float(r)) < q else (np.nextafter(r, t(-math.inf)), r)
    while Fraction(float(hi)) < q:
        lo, hi = hi, np.nextafter(hi, t(math.inf))
    while Fraction(float(lo)) > q:
        lo, hi = np.nextafter(lo, t(-math.inf)), lo
    if mode == "ru":
        return hi
    if mode == "rd":
        return lo
    if mode == "rz":
        return lo if q > 0 else hi
    dlo, dhi = q - Fraction(float(lo)), Fraction(float(hi)) - q
    if dlo != dhi:
        return lo if dlo < dhi else hi
    return lo if _is_even(lo, dtype) else hi


def _sqrt_exact(x):
    """sqrt(x) of a positive Fraction: exact where the root is rational, else a Fraction
    strictly inside an interval of width 2^-2200 around it, which holds no float32 or float64
    (a root that is not representable is at least 2^-700 away from every float)."""
    k = 2200
    lo = Fraction(math.isqrt(x.numerator * 4 ** k // x.denominator), 2 ** k)
    return lo if lo * lo == x else lo + Fraction(1, 2 ** (k + 1))


#: The exact operations, and the same in float64 for what is not finite or is an exact zero
_EXACT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "rcp": lambda a: 1 / a, "sqrt": _sqrt_exact,
          "fma": lambda a, b, c: a * b + c}
_FLOAT = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "rcp": lambda a: np.divide(1.0, a), "sqrt": np.sqrt, "fma": lambda a, b, c: a * b + c}


def _rounded(op, dtype, mode):
    """``op`` (add, sub, mul, div, rcp, sqrt, fma) rounded once to ``dtype`` in ``mode``."""
    def one(*v):
        f = [np.float64(x) for x in v]
        special = (not all(np.isfinite(f)) or (op in ("div", "rcp") and f[-1] == 0)
                   or (op == "sqrt" and f[0] <= 0))
        if not special:
            q = _EXACT[op](*(Fraction(float(x)) for x in f))
            if q != 0:
                return _round_exact(q, dtype, mode)
        # IEEE's infinities, NaNs and signed zeros, as float64 gives them (round to nearest) ...
        with np.errstate(all="ignore"):
            r = dtype.type(_FLOAT[op](*f))
        if not special and mode == "rd" and op in ("add", "sub", "fma"):
            # ... except that an exact zero sum is -0 when rounding down (+0 + +0 stays +0)
            terms = {"add": (f[0], f[1]), "sub": (f[0], -f[1])}.get(op) or (f[0] * f[1], f[2])
            if not all(t == 0 and not np.signbit(t) for t in terms):
                r = dtype.type(-0.0)
        return r

    def f(*xs):
        return np.frompyfunc(one, len(xs), 1)(*xs).astype(dtype)
    return f


def _fma(a, b, c):
    """fma(a, b, c) = a * b + c rounded once (float32 or float64, as its arguments)."""
    return _rounded("fma", np.asarray(a).dtype, "rn")(a, b, c)


def _float_to_int(mode, itype):
    rnd = {"rn": np.rint, "rz": np.trunc, "ru": np.ceil, "rd": np.floor}[mode]
    info = np.iinfo(itype)

    def f(x):
        r = rnd(np.nan_to_num(np.asarray(x, F64), nan=0.0, posinf=np.inf, neginf=-np.inf))
        # cvt saturates (NaN gives 0); compared as floats, as 2^63 - 1 is not a float64
        hi, lo = r >= float(info.max), r <= float(info.min)
        out = np.where(hi | lo, 0, r).astype(itype)
        return np.where(hi, info.max, np.where(lo, info.min, out)).astype(itype)
    return f


def _int_to_float(mode, dtype):
    def f(x):
        return np.frompyfunc(lambda v: _round_exact(Fraction(int(v)), dtype, mode), 1, 1)(x).astype(dtype)
    return f


# ---------------------------------------------------------------------------------------
# The fast approximations, as cuda_emu.h computes __expf and friends
# ---------------------------------------------------------------------------------------
def _ftz(x):
    x = np.asarray(x, F32)
    return np.where(np.abs(x) < np.finfo(F32).tiny, np.copysign(np.float32(0), x), x).astype(F32)


def _ex2(x):
    # exp2 and log2 correctly rounded, as glibc's exp2f and log2f (the emulator's) are
    return _ftz(np.exp2(_ftz(x).astype(F64)).astype(F32))


def _lg2(x):
    return np.log2(_ftz(x).astype(F64)).astype(F32)


def _fast_fdividef(x, y):
    x, y = np.asarray(x, F32), np.asarray(y, F32)
    ay = np.abs(y)
    huge = (ay > np.float32(2.0 ** 126)) & (ay <= np.finfo(F32).max)
    with np.errstate(all="ignore"):
        out = x * _ftz(np.float32(1) / y)
    return np.where(huge, np.where(np.isinf(x), np.float32(np.nan), np.float32(0)), out).astype(F32)


FAST = {
    "fast_expf": lambda x: _ex2(np.asarray(x, F32) * LOG2E_F32),
    "fast_exp10f": lambda x: _ex2(np.asarray(x, F32) * LOG2_10_F32),
    "fast_logf": lambda x: (_lg2(x) * LN2_F32).astype(F32),
    "fast_log2f": _lg2,
    "fast_log10f": lambda x: (_lg2(x) * np.float32(0.301029996)).astype(F32),
    "fast_powf": lambda x, y: _ex2(np.asarray(y, F32) * _lg2(x)),
    "fast_sinf": lambda x: np.sin(np.asarray(x, F32)),
    "fast_cosf": lambda x: np.cos(np.asarray(x, F32)),
    "fast_tanf": lambda x: np.tan(np.asarray(x, F32)),
    "fast_fdividef": _fast_fdividef,
}


# ---------------------------------------------------------------------------------------
# Integers and bits
# ---------------------------------------------------------------------------------------
def _elementwise_uint(fn, width, out):
    """``fn`` on each element's bits read as an unsigned ``width``-bit integer."""
    def f(x):
        u = np.array(x, dtype=np.int64 if width == 32 else np.asarray(x).dtype, order="C")
        u = u.view(np.uint64) & np.uint64(2 ** width - 1)
        return np.asarray(np.frompyfunc(lambda v: fn(int(v)), 1, 1)(u)).astype(out)
    return f


def _brev(width):
    return lambda v: int(format(v, f"0{width}b")[::-1], 2)


def _clz(width):
    return lambda v: width - v.bit_length()


def _ffs(v):
    return (v & -v).bit_length()


def _byte_perm(x, y, s):
    def one(a, b, sel):
        word = (int(b) & 0xFFFFFFFF) << 32 | (int(a) & 0xFFFFFFFF)
        out = 0
        for n in range(4):
            k = (int(sel) >> (4 * n)) & 7
            out |= ((word >> (8 * k)) & 0xFF) << (8 * n)
        return out
    return np.frompyfunc(one, 3, 1)(x, y, s).astype(np.uint32).view(np.int32)


def _sign24(v):
    v = int(v) & 0xFFFFFF
    return v - (1 << 24) if v & 0x800000 else v


def _hi(width, signed):
    def f(a, b):
        def one(x, y):
            return (int(x) * int(y)) >> width
        dt = {(32, True): np.int32, (32, False): np.uint32, (64, True): np.int64, (64, False): np.uint64}[width, signed]
        return np.frompyfunc(one, 2, 1)(a, b).astype(dt)
    return f


def _view(dtype):
    return lambda x: np.array(x, order="C").view(dtype)


def _rcp64h(x):
    """1/x with the low 32 bits of the result zeroed, as rcp.approx.ftz.f64 gives it (the
    GPU's own approximation agrees in the leading 20 or so bits)."""
    with np.errstate(all="ignore"):
        r = np.array(1.0 / np.asarray(x, F64), order="C")
    return (r.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(F64)


def _hiloint2double(hi, lo):
    h = np.asarray(hi).astype(np.int64).view(np.uint64) & 0xFFFFFFFF
    l_ = np.asarray(lo).astype(np.int64).view(np.uint64) & 0xFFFFFFFF
    return ((h << np.uint64(32)) | l_).view(F64)


INTEGER = {
    "abs": np.abs, "llabs": np.abs,
    "popc": _elementwise_uint(lambda v: bin(v).count("1"), 32, np.int32),
    "popcll": _elementwise_uint(lambda v: bin(v).count("1"), 64, np.int32),
    "clz": _elementwise_uint(_clz(32), 32, np.int32), "clzll": _elementwise_uint(_clz(64), 64, np.int32),
    "ffs": _elementwise_uint(_ffs, 32, np.int32), "ffsll": _elementwise_uint(_ffs, 64, np.int32),
    "brev": lambda x: _elementwise_uint(_brev(32), 32, np.uint32)(x).view(np.asarray(x).dtype),
    "brevll": lambda x: _elementwise_uint(_brev(64), 64, np.uint64)(x).view(np.asarray(x).dtype),
    "byte_perm": _byte_perm,
    "hadd": lambda a, b: ((a.astype(np.int64) + b) >> 1).astype(np.int32),
    "rhadd": lambda a, b: ((a.astype(np.int64) + b + 1) >> 1).astype(np.int32),
    "uhadd": lambda a, b: ((a.astype(np.uint64) + b) >> np.uint64(1)).astype(np.uint32),
    "urhadd": lambda a, b: ((a.astype(np.uint64) + b + np.uint64(1)) >> np.uint64(1)).astype(np.uint32),
    "mul24": lambda a, b: np.frompyfunc(lambda x, y: (_sign24(x) * _sign24(y)) & 0xFFFFFFFF, 2, 1)(a, b)
    .astype(np.uint32).view(np.int32),
    "umul24": lambda a, b: np.frompyfunc(lambda x, y: ((int(x) & 0xFFFFFF) * (int(y) & 0xFFFFFF)) & 0xFFFFFFFF,
                                         2, 1)(a, b).astype(np.uint32),
    "mulhi": _hi(32, True), "umulhi": _hi(32, False), "mul64hi": _hi(64, True), "umul64hi": _hi(64, False),
    "sad": lambda x, y, z: (np.abs(x.astype(np.int64) - y) + z.astype(np.int64)).astype(np.uint32).view(np.int32),
    "usad": lambda x, y, z: (np.abs(x.astype(np.int64) - y) + z.astype(np.int64)).astype(np.uint32),
    "float_as_int": _view(np.int32), "int_as_float": _view(F32), "float_as_uint": _view(np.uint32),
    "uint_as_float": _view(F32), "double_as_longlong": _view(np.int64), "longlong_as_double": _view(F64),
    "double2hiint": lambda x: (np.array(x, F64, order="C").view(np.uint64) >> np.uint64(32)).astype(np.uint32)
    .view(np.int32),
    "double2loint": lambda x: (np.array(x, F64, order="C").view(np.uint64) & np.uint64(0xFFFFFFFF))
    .astype(np.uint32).view(np.int32),
    "hiloint2double": _hiloint2double, "rcp64h": _rcp64h,
    "isnan": lambda x: np.isnan(x).astype(np.int32), "isinf": lambda x: np.isinf(x).astype(np.int32),
    "isfinite": lambda x: np.isfinite(x).astype(np.int32), "finite": lambda x: np.isfinite(x).astype(np.int32),
    "signbit": lambda x: np.signbit(x).astype(np.int32), "ilogb": _ilogb,
    "ldexp": lambda x, n: np.ldexp(x, np.asarray(n, np.int32)),
    "scalbn": lambda x, n: np.ldexp(x, np.asarray(n, np.int32)),
    "powi": lambda x, n: np.power(np.asarray(x, F64), np.asarray(n, F64)),
    "nextafter": np.nextafter, "fma": _fma, "llrint": lambda x: np.rint(x).astype(np.int64),
    "llround": lambda x: _round_half_away(x).astype(np.int64),
}


def _rounding_family(name):
    """The functions named after a rounding mode: ``fadd_rz``, ``dmul_ru``, ``fmaf_rd``,
    ``frcp_rn``, ``double2float_rd``, ``float2int_ru``, ``ull2double_rz``..."""
    base, _, mode = name.rpartition("_")
    if mode not in ("rn", "rz", "ru", "rd"):
        return None
    for prefix, dtype in (("f", F32), ("d", F64)):
        if base in (prefix + op for op in ("add", "sub", "mul", "div", "rcp", "sqrt")):
            return _rounded(base[1:], dtype, mode)
    if base in ("fma", "fmaf"):
        return _rounded("fma", F64 if base == "fma" else F32, mode)
    if base == "double2float":
        return lambda x: np.frompyfunc(
            lambda v: _round_exact(Fraction(float(v)) if np.isfinite(v) and v != 0 else float(v), F32, mode),
            1, 1)(x).astype(F32)
    src, _, dst = base.partition("2")
    ints = {"int": np.int32, "uint": np.uint32, "ll": np.int64, "ull": np.uint64}
    if src in ("float", "double") and dst in ints:
        return _float_to_int(mode, ints[dst])
    if src in ints and dst in ("float", "double"):
        return _int_to_float(mode, F32 if dst == "float" else F64)
    return None


def _lookup(name):
    for table in (FAST, INTEGER, UNARY, MULTI):
        if name in table:
            return table[name]
    return _rounding_family(name)


def function_for(symbol: str):
    """The NumPy function for a libdevice symbol (``__nv_asinf``), or None."""
    name = symbol[len("__nv_"):] if symbol.startswith("__nv_") else symbol
    for candidate in (name, name[:-1] if name.endswith(("f", "d")) else None):
        if candidate and (fn := _lookup(candidate)) is not None:
            return fn
    return None


def evaluate(symbol: str, args, out_dtype) -> np.ndarray:
    """The values of ``symbol`` (``__nv_asinf``...) on NumPy arrays ``args``, as ``out_dtype``."""
    fn = function_for(symbol)
    if fn is None:
        raise LibdeviceNotSimulated(
            f"libdevice's {symbol} has no twin in Triton's interpreter (the course's simulation): "
            "it runs only on a GPU. Write it from the tl.* functions, or test that kernel on a GPU")
    out_dtype = np.dtype(out_dtype)
    arrays = [np.asarray(a) for a in args]
    is_float = out_dtype.kind == "f" and all(a.dtype.kind == "f" for a in arrays)
    if is_float and (fn in UNARY.values() or fn in MULTI.values()):
        arrays = [a.astype(F64) for a in arrays]  # computed in float64, rounded once below
    with np.errstate(all="ignore"):
        out = np.asarray(fn(*arrays))
    if out.dtype != out_dtype:
        out = out.astype(out_dtype) if out.dtype.itemsize != out_dtype.itemsize or out.dtype.kind == "f" \
            or out_dtype.kind == "f" else out.view(out_dtype)
    return out
