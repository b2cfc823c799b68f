"""The operator names python-graphblas 2025.2 defines, as strings: the words of the GraphBLAS ops'
operator arguments (``server/ops/graphblas.py``). Written out rather than read from python-graphblas so
that the catalogue, OpenAPI and the SDK are built without importing it (half a second, and SuiteSparse's
initialisation); ``tests/oracle/test_oracle_graphblas.py`` holds these lists equal to the installed
python-graphblas's, so a release that adds an operator fails there until it is added here.
"""

__all__ = ["SEMIRINGS", "MONOIDS", "BINARY_OPS", "UNARY_OPS", "INDEX_UNARY_OPS", "SELECT_OPS"]

SEMIRINGS = (
    "any_cdiv", "any_eq", "any_first", "any_firsti", "any_firsti1", "any_firstj", "any_firstj1", "any_floordiv",
    "any_ge", "any_gt", "any_iseq", "any_isge", "any_isgt", "any_isle", "any_islt", "any_isne", "any_land",
    "any_le", "any_lor", "any_lt", "any_lxor", "any_max", "any_min", "any_minus", "any_ne", "any_pair",
    "any_plus", "any_rdiv", "any_rfloordiv", "any_rminus", "any_rtruediv", "any_second", "any_secondi",
    "any_secondi1", "any_secondj", "any_secondj1", "any_times", "any_truediv", "band_band", "band_bor",
    "band_bxnor", "band_bxor", "bor_band", "bor_bor", "bor_bxnor", "bor_bxor", "bxnor_band", "bxnor_bor",
    "bxnor_bxnor", "bxnor_bxor", "bxor_band", "bxor_bor", "bxor_bxnor", "bxor_bxor", "eq_eq", "eq_first",
    "eq_ge", "eq_gt", "eq_land", "eq_le", "eq_lor", "eq_lt", "eq_lxor", "eq_ne", "eq_pair", "eq_second",
    "land_eq", "land_first", "land_ge", "land_gt", "land_land", "land_le", "land_lor", "land_lt", "land_lxor",
    "land_ne", "land_pair", "land_second", "lor_eq", "lor_first", "lor_ge", "lor_gt", "lor_land", "lor_le",
    "lor_lor", "lor_lt", "lor_lxor", "lor_ne", "lor_pair", "lor_second", "lxnor_lor", "lxor_eq", "lxor_first",
    "lxor_ge", "lxor_gt", "lxor_land", "lxor_le", "lxor_lor", "lxor_lt", "lxor_lxor", "lxor_ne", "lxor_pair",
    "lxor_second", "max_absfirst", "max_abssecond", "max_cdiv", "max_first", "max_firsti", "max_firsti1",
    "max_firstj", "max_firstj1", "max_floordiv", "max_iseq", "max_isge", "max_isgt", "max_isle", "max_islt",
    "max_isne", "max_land", "max_lor", "max_lxor", "max_max", "max_min", "max_minus", "max_pair", "max_plus",
    "max_rdiv", "max_rfloordiv", "max_rminus", "max_rtruediv", "max_second", "max_secondi", "max_secondi1",
    "max_secondj", "max_secondj1", "max_times", "max_truediv", "min_cdiv", "min_first", "min_firsti",
    "min_firsti1", "min_firstj", "min_firstj1", "min_floordiv", "min_iseq", "min_isge", "min_isgt", "min_isle",
    "min_islt", "min_isne", "min_land", "min_lor", "min_lxor", "min_max", "min_min", "min_minus", "min_pair",
    "min_plus", "min_rdiv", "min_rfloordiv", "min_rminus", "min_rtruediv", "min_second", "min_secondi",
    "min_secondi1", "min_secondj", "min_secondj1", "min_times", "min_truediv", "plus_absfirst",
    "plus_abssecond", "plus_cdiv", "plus_first", "plus_firsti", "plus_firsti1", "plus_firstj", "plus_firstj1",
    "plus_floordiv", "plus_iseq", "plus_isge", "plus_isgt", "plus_isle", "plus_islt", "plus_isne", "plus_land",
    "plus_lor", "plus_lxor", "plus_max", "plus_min", "plus_minus", "plus_pair", "plus_plus", "plus_pow",
    "plus_rdiv", "plus_rfloordiv", "plus_rminus", "plus_rpow", "plus_rtruediv", "plus_second", "plus_secondi",
    "plus_secondi1", "plus_secondj", "plus_secondj1", "plus_times", "plus_truediv", "times_cdiv", "times_first",
    "times_firsti", "times_firsti1", "times_firstj", "times_firstj1", "times_floordiv", "times_iseq",
    "times_isge", "times_isgt", "times_isle", "times_islt", "times_isne", "times_land", "times_lor",
    "times_lxor", "times_max", "times_min", "times_minus", "times_pair", "times_plus", "times_rdiv",
    "times_rfloordiv", "times_rminus", "times_rtruediv", "times_second", "times_secondi", "times_secondi1",
    "times_secondj", "times_secondj1", "times_times", "times_truediv",
)

MONOIDS = (
    "any", "band", "bor", "bxnor", "bxor", "eq", "land", "lor", "lxnor", "lxor", "max", "min", "plus", "times",
)

BINARY_OPS = (
    "absfirst", "abssecond", "any", "atan2", "band", "bclr", "bget", "binom", "bor", "bset", "bshift", "bxnor",
    "bxor", "cdiv", "cmplx", "copysign", "eq", "first", "firsti", "firsti1", "firstj", "firstj1", "floordiv",
    "fmod", "ge", "gt", "hypot", "iseq", "isge", "isgt", "isle", "islt", "isne", "land", "ldexp", "le", "lor",
    "lt", "lxnor", "lxor", "max", "min", "minus", "ne", "pair", "plus", "pow", "rdiv", "remainder", "rfloordiv",
    "rminus", "rpow", "rtruediv", "second", "secondi", "secondi1", "secondj", "secondj1", "times", "truediv",
)

UNARY_OPS = (
    "abs", "acos", "acosh", "ainv", "asin", "asinh", "atan", "atanh", "bnot", "carg", "cbrt", "ceil", "cimag",
    "conj", "cos", "cosh", "creal", "erf", "erfc", "exp", "exp2", "expm1", "floor", "frexpe", "frexpx",
    "identity", "isfinite", "isinf", "isnan", "lgamma", "lnot", "log", "log10", "log1p", "log2", "minv", "one",
    "positioni", "positioni1", "positionj", "positionj1", "round", "signum", "sin", "sinh", "sqrt", "tan",
    "tanh", "tgamma", "trunc",
)

INDEX_UNARY_OPS = (
    "colgt", "colindex", "colle", "diag", "diagindex", "index", "indexgt", "indexle", "offdiag", "rowgt",
    "rowindex", "rowle", "tril", "triu", "valueeq", "valuege", "valuegt", "valuele", "valuelt", "valuene",
)

SELECT_OPS = (
    "colgt", "colle", "diag", "indexgt", "indexle", "offdiag", "rowgt", "rowle", "tril", "triu", "valueeq",
    "valuege", "valuegt", "valuele", "valuelt", "valuene",
)
