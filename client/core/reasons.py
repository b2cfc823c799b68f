"""Every reason an error of the service can carry: one member per reason, with the codes it is
raised under and what it means. The raising code names its reason from here
(``InvalidArgumentError(message, reason=Reason.SHAPE_MISMATCH)``); ``make docs`` writes the
table in docs/contract.md from it. A reason is a ``str``: callers compare ``err.reason`` with a
member or with its name."""

from __future__ import annotations

from enum import StrEnum, auto

__all__ = ["Reason"]

(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED,
 UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, CANCELLED) = (
    "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "PERMISSION_DENIED",
    "UNIMPLEMENTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED")


class Reason(StrEnum):
    codes: tuple[str, ...]  # the codes it is raised under, the most common first
    meaning: str  # the broken rule, in one sentence

    @staticmethod
    def _generate_next_value_(name, *_):  # auto(): the member's value is its name
        return name

    def __new__(cls, value: str, codes: tuple[str, ...] | str, meaning: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.codes = (codes,) if isinstance(codes, str) else tuple(codes)
        member.meaning = meaning
        return member

    # ---- tensor validation: a tensor's shape, layout, dtype and index invariants
    NEGATIVE_DIMENSION = auto(), INVALID_ARGUMENT, "A dimension of a shape, or a size argument, is negative."
    SHAPE_OVERFLOW = auto(), INVALID_ARGUMENT, "A shape, or its number of elements, does not fit in int64."
    TOO_MANY_DIMENSIONS = auto(), INVALID_ARGUMENT, "A shape has more dimensions than an array can have."
    BAD_LAYOUT = auto(), INVALID_ARGUMENT, "The layout named is not one the service knows, or not one the op allows."
    BAD_DTYPE = auto(), INVALID_ARGUMENT, "A dtype is not a supported one, or not the one an argument must have."
    INDEX_DTYPE = (auto(), INVALID_ARGUMENT,
                   "Index arrays must hold integers, int32 or int64, one dtype for all of a tensor's.")
    INDICES_RANK = auto(), INVALID_ARGUMENT, "An index array has the wrong number of dimensions."
    RANK_MISMATCH = (auto(), INVALID_ARGUMENT,
                     "A shape, index or list has a different rank than the tensor it goes with.")
    BATCH_MISMATCH = (auto(), INVALID_ARGUMENT,
                      "A compressed tensor's index arrays and shape disagree on the batch dimensions.")
    BLOCKSIZE = (auto(), INVALID_ARGUMENT,
                 "A blocksize is missing, given for a non-block layout, or does not divide the shape.")
    COMPRESSED_LENGTH = (auto(), INVALID_ARGUMENT,
                         "compressed_indices has the wrong length for the compressed dimension.")
    COMPRESSED_START = auto(), INVALID_ARGUMENT, "compressed_indices does not start at 0."
    COMPRESSED_DECREASING = auto(), INVALID_ARGUMENT, "compressed_indices decreases somewhere; it must never decrease."
    COMPRESSED_STEP = auto(), INVALID_ARGUMENT, "compressed_indices steps by more than the size of the plain dimension."
    COMPRESSED_END = auto(), INVALID_ARGUMENT, "compressed_indices does not end at the number of stored entries."
    INDEX_OUT_OF_RANGE = auto(), INVALID_ARGUMENT, "An index is outside the dimension it indexes."
    VALUES_SHAPE_MISMATCH = (auto(), INVALID_ARGUMENT,
                             "A values array's shape does not match what the indices and shape imply.")
    INDICES_REPEATED = auto(), INVALID_ARGUMENT, "An index appears twice where indices must be unique."
    INDICES_UNSORTED = auto(), INVALID_ARGUMENT, "Indices are out of order where they must be sorted."
    BATCH_NSE_MISMATCH = (auto(), INVALID_ARGUMENT,
                          "A batched compressed tensor would need a different number of entries per batch.")
    DENSE_DIM = (auto(), INVALID_ARGUMENT,
                 "The dense dimensions asked for leave too few sparse dimensions for the layout.")

    # ---- wire and decoding: bodies, streams and tensor messages
    BAD_BODY = (auto(), INVALID_ARGUMENT,
                "A body is not the protobuf message the call expects, or is longer than declared.")
    BAD_JSON = auto(), INVALID_ARGUMENT, "A JSON body is not valid JSON or not the object the call expects."
    BAD_JSON_TENSOR = (auto(), INVALID_ARGUMENT,
                       "A JSON value meant as a tensor is not one, or misses a field its layout needs.")
    BAD_STREAM = (auto(), INVALID_ARGUMENT,
                  "A chunk or frame stream is malformed: no header, two headers, or data out of place.")
    BUFFER_LENGTH = auto(), INVALID_ARGUMENT, "A data buffer holds more or fewer bytes than its dtype and shape need."
    MISSING_TENSOR = auto(), INVALID_ARGUMENT, "A Tensor message sets none of sparse, dense or handle."
    BAD_TIMEOUT = auto(), INVALID_ARGUMENT, "The timeout header is not a positive number of seconds."
    BAD_PARTITIONS = auto(), INVALID_ARGUMENT, "The partitions asked for are not an integer in the allowed range."

    # ---- op arguments: binding and each op's own rules
    MISSING_ARGUMENT = auto(), INVALID_ARGUMENT, "A required argument of the op was not given."
    UNKNOWN_ARGUMENT = auto(), INVALID_ARGUMENT, "The op has no argument of the name given."
    UNEXPECTED_ARGUMENT = (auto(), INVALID_ARGUMENT,
                           "An argument was given that does not apply to the other arguments chosen.")
    EXCLUSIVE_ARGUMENTS = auto(), INVALID_ARGUMENT, "Two arguments were given that cannot be used together."
    BAD_ARGUMENT_TYPE = (auto(), INVALID_ARGUMENT,
                         "An argument is not of its declared type (tensor, integer, list, string, ...).")
    SCALAR_DTYPE = auto(), INVALID_ARGUMENT, "A scalar argument cannot be represented exactly in the tensor's dtype."
    VALUE_OUT_OF_RANGE = (auto(), INVALID_ARGUMENT,
                          "A value, in an argument or a tensor, is outside the range the op accepts.")
    AXIS_OUT_OF_RANGE = (auto(), INVALID_ARGUMENT,
                         "An axis or dimension argument is outside the tensor's rank, or not one the op takes.")
    SHAPE_MISMATCH = (auto(), INVALID_ARGUMENT,
                      "Two operands' shapes do not fit together for the op; the message gives both.")
    DTYPE_MISMATCH = auto(), INVALID_ARGUMENT, "Operands that must share one dtype have different dtypes."
    SPARSE_DIM_MISMATCH = (auto(), INVALID_ARGUMENT,
                           "Sparse operands that must have equally many sparse dimensions do not.")
    SIZE_MISMATCH = auto(), INVALID_ARGUMENT, "Two arguments that must have equally many entries do not."
    RANK = auto(), INVALID_ARGUMENT, "An operand does not have the rank the op needs (a vector, a matrix, no batch)."
    RANK_TOO_LOW = (auto(), INVALID_ARGUMENT,
                    "A tensor would have, or has, too few dimensions for the op or for sparsity.")
    EMPTY_LIST = auto(), INVALID_ARGUMENT, "A list argument that needs at least one tensor is empty."
    EMPTY_DIMENSION = auto(), INVALID_ARGUMENT, "A sparse dimension is empty where the op needs it non-empty."
    BAD_PERMUTATION = auto(), INVALID_ARGUMENT, "perm is not a permutation of the tensor's dimensions."
    PERM_MIXES_SPARSE_AND_DENSE = (auto(), INVALID_ARGUMENT,
                                   "perm would move a dense dimension among the sparse ones or back.")
    CANNOT_INFER_DIMENSION = (auto(), INVALID_ARGUMENT,
                              "A -1 in a shape cannot be inferred because the other dimensions multiply to 0.")
    MULTIPLE_INFERRED_DIMENSIONS = (auto(), INVALID_ARGUMENT,
                                    "A shape has more than one -1; at most one dimension may be inferred.")
    SHAPE_SIZE_MISMATCH = auto(), INVALID_ARGUMENT, "A new shape holds a different number of elements than the tensor."
    SHAPE_TOO_SMALL = (auto(), INVALID_ARGUMENT,
                       "A new shape is smaller than the tensor in some dimension; it may only grow.")
    DENSE_DIMS_CHANGED = auto(), INVALID_ARGUMENT, "A new shape changes the dense dimensions of a hybrid tensor."
    NEGATIVE_SLICE = auto(), INVALID_ARGUMENT, "A slice size is negative (a negative start shifts the entries)."
    BAD_SLICE_STEP = auto(), INVALID_ARGUMENT, "A slice step is zero or negative; steps must be positive."
    TOO_MANY_INDICES = auto(), INVALID_ARGUMENT, "An index has more items than the tensor has dimensions."
    BAD_NUM_SPLIT = auto(), INVALID_ARGUMENT, "num_split is not between 1 and the size of the split dimension."
    BAD_DIAGONALS = auto(), INVALID_ARGUMENT, "diagonals is not a vector or a matrix."
    BAD_OFFSETS = auto(), INVALID_ARGUMENT, "offsets is not a scalar or vector of integers that fit in int64."
    DUPLICATE_OFFSETS = auto(), INVALID_ARGUMENT, "offsets names one diagonal twice."
    BAD_REDUCE = auto(), INVALID_ARGUMENT, "reduce names no reduction the op knows."
    UNKNOWN_FUNCTION = auto(), INVALID_ARGUMENT, "fn names no function map_values knows."
    NOT_ZERO_PRESERVING = (auto(), INVALID_ARGUMENT,
                           "The function does not map 0 to 0, so it would change every implicit zero.")
    DIVISION_BY_ZERO = auto(), INVALID_ARGUMENT, "A stored entry would be divided by zero."
    SEGMENT_IDS_UNSORTED = auto(), INVALID_ARGUMENT, "segment_ids is not sorted in non-decreasing order."
    SEGMENT_ID_OUT_OF_RANGE = auto(), INVALID_ARGUMENT, "A segment id is negative or not below num_segments."

    # ---- what an op supports
    UNSUPPORTED_LAYOUT = (auto(), (UNIMPLEMENTED, INVALID_ARGUMENT),
                          "The op does not take an operand in this layout (sparse or dense, or this sparse layout).")
    UNSUPPORTED_DTYPE = auto(), (UNIMPLEMENTED, INVALID_ARGUMENT), "The op does not take values of this dtype."
    UNSUPPORTED_HYBRID = auto(), UNIMPLEMENTED, "The op does not take hybrid tensors (sparse with dense dimensions)."
    UNSUPPORTED_BATCH = auto(), UNIMPLEMENTED, "The op does not take batched operands here; it needs 2-D matrices."
    MISSING_DEPENDENCY = auto(), UNIMPLEMENTED, "The op needs a library, such as scipy, that the server lacks."

    # ---- GraphBLAS operations (server/ops/graphblas.py)
    BAD_OPERATOR = (auto(), INVALID_ARGUMENT,
                    "A semiring, monoid, binary, unary, index-unary or select operator is not one python-graphblas "
                    "names, or not of the kind the argument takes.")
    OPERATOR_DTYPE = (auto(), INVALID_ARGUMENT,
                      "The operator named is not defined for the operands' dtypes (band_bor on floats, say).")

    # ---- solvers, eigensolvers and factorizations
    NOT_SQUARE = auto(), INVALID_ARGUMENT, "The matrix is not square, and the op needs a square one."
    EMPTY = auto(), INVALID_ARGUMENT, "The matrix has no rows or no columns, and the op needs a non-empty one."
    NOT_DENSE = auto(), INVALID_ARGUMENT, "The right-hand side is sparse, and the op needs it dense."
    NOT_FINITE = (auto(), INVALID_ARGUMENT,
                  "A matrix, vector or shift holds nan or inf, and the op needs finite numbers.")
    NOT_HERMITIAN = auto(), INVALID_ARGUMENT, "The matrix is not symmetric (Hermitian), and the op needs one that is."
    SINGULAR = (auto(), INVALID_ARGUMENT,
                "The matrix, or the matrix less the shift, is singular and cannot be factorized.")
    BAD_FACTOR = (auto(), INVALID_ARGUMENT,
                  "factor is not the four tensors [L, U, perm_r, perm_c] that factorize returns.")
    BAD_WHICH = auto(), INVALID_ARGUMENT, "which names no part of the spectrum the op knows."
    K_OUT_OF_RANGE = (auto(), INVALID_ARGUMENT,
                      "k is not between 1 and the most eigenvalues or singular values ARPACK can find.")
    BAD_TOL = auto(), INVALID_ARGUMENT, "The eigensolver's tol is not a finite number >= 0."
    BAD_MODE = (auto(), INVALID_ARGUMENT,
                "mode names none of eigsh's shift-invert modes, or one the matrix's dtype does not take.")
    BAD_SOLVER = (auto(), INVALID_ARGUMENT,
                  "solver names none the op knows, or one that cannot answer what was asked of this matrix.")
    NOT_CONVERGED = (auto(), INTERNAL,
                     "The eigensolver did not reach its tolerance within maxiter; nothing was wrong with the input.")
    BAD_TOLERANCE = (auto(), INVALID_ARGUMENT,
                     "rtol or atol is not a number >= 0 (inf is one), or is not allowed by the method.")
    BAD_MAXITER = auto(), INVALID_ARGUMENT, "A solver's maxiter is below 1 (null means scipy's default, 10 n)."
    BAD_RESTART = auto(), INVALID_ARGUMENT, "gmres's restart, the inner iterations between restarts, is below 1."
    BAD_PRECONDITIONER = auto(), INVALID_ARGUMENT, "preconditioner names none the solvers know."
    SINGULAR_PRECONDITIONER = (auto(), INVALID_ARGUMENT,
                               "The preconditioner cannot be built: a zero or missing diagonal entry or pivot.")
    INDEFINITE_PRECONDITIONER = (auto(), INVALID_ARGUMENT,
                                 "minres's preconditioner is not symmetric positive definite, as the method needs.")
    PRECONDITIONER_NOT_PARTITIONED = (auto(), UNIMPLEMENTED,
                                      "This preconditioner is not available for a partitioned matrix.")
    BAD_AMG_OPTION = (auto(), INVALID_ARGUMENT,
                      "amg_options names an option, method or parameter pyamg's smoothed aggregation does not "
                      "take here, or a value outside its rule.")
    BAD_ACCEL = auto(), INVALID_ARGUMENT, "amg_solve's accel names no Krylov method it can accelerate with."

    # ---- pipelines
    EMPTY_PIPELINE = auto(), INVALID_ARGUMENT, "A pipeline has no steps."
    PIPELINE_TOO_LONG = auto(), INVALID_ARGUMENT, "A pipeline has more steps than allowed."
    BAD_STEP_NAME = auto(), INVALID_ARGUMENT, "A step name is repeated or contains a '.'."
    UNKNOWN_OUTPUT = auto(), INVALID_ARGUMENT, "The pipeline asks for an output that no step produces."
    UNKNOWN_REF = auto(), INVALID_ARGUMENT, "An argument names an output that no earlier step produces."
    BAD_REF = (auto(), INVALID_ARGUMENT,
               "A reference to an output is used where it cannot be: wrong kind, index or place.")

    # ---- handles and the store
    UNKNOWN_OP = auto(), NOT_FOUND, "No op has the name called."
    UNKNOWN_HANDLE = auto(), NOT_FOUND, "No tensor has this handle: never made, deleted, or forgotten since."
    EVICTED = auto(), NOT_FOUND, "The handle's tensor was evicted to make room and is gone."
    EXPIRED = auto(), NOT_FOUND, "The handle's tensor outlived its time to live and is gone."
    DAMAGED = auto(), NOT_FOUND, "The handle's spilled file failed its check and the tensor is gone."
    OTHER_TENANT = auto(), PERMISSION_DENIED, "The handle belongs to another tenant."
    BAD_HANDLE = (auto(), INVALID_ARGUMENT,
                  "A handle reached an op unresolved; the service resolves handles before binding.")
    DISK_ERROR = auto(), UNAVAILABLE, "The spill directory could not be read or written; retry later."
    NOT_PARTITIONABLE = auto(), UNIMPLEMENTED, "The tensor cannot be split into partitions."
    NO_CLUSTER = auto(), UNIMPLEMENTED, "Partitions were asked for, but the server runs without a Dask cluster."
    CLUSTER_UNAVAILABLE = auto(), UNAVAILABLE, "The Dask cluster could not be reached or did not answer."
    WORKER_LOST = auto(), UNAVAILABLE, "A Dask worker holding part of a partitioned tensor was lost."

    # ---- limits and quotas
    REQUEST_TOO_LARGE = auto(), RESOURCE_EXHAUSTED, "The request is over the server's request size limit."
    RESPONSE_TOO_LARGE = (auto(), RESOURCE_EXHAUSTED,
                          "The reply was over the client's message size limit (set by the SDK from gRPC).")
    MESSAGE_TOO_LARGE = (auto(), RESOURCE_EXHAUSTED,
                         "The reply would be over the message size limit; keep the result and fetch it.")
    RESULT_TOO_LARGE = (auto(), RESOURCE_EXHAUSTED,
                        "The result, or a partitioned tensor gathered whole, is over the result size limit.")
    TENSOR_TOO_LARGE = (auto(), RESOURCE_EXHAUSTED,
                        "A streamed tensor is over the size its reader allows (ChunkAssembler's default).")
    STORE_BUDGET = (auto(), RESOURCE_EXHAUSTED,
                    "The tensor does not fit in the store's (or the disk tier's) byte budget.")
    TENANT_QUOTA = auto(), RESOURCE_EXHAUSTED, "The tensor would put its tenant over its share of the store."
    NNZ_TOO_LARGE = auto(), RESOURCE_EXHAUSTED, "A tensor has more stored values than the server's limit."
    RANK_TOO_LARGE = (auto(), RESOURCE_EXHAUSTED,
                      "A tensor or per-dimension list has more dimensions than the server's limit.")
    JSON_TOO_DEEP = auto(), RESOURCE_EXHAUSTED, "A JSON body nests deeper than the server's limit."
    OUT_OF_MEMORY = auto(), RESOURCE_EXHAUSTED, "The op ran out of memory."
    DISK_FULL = auto(), RESOURCE_EXHAUSTED, "The spill directory's disk is full."

    # ---- shared memory
    SHARED_MEMORY_OFF = auto(), UNIMPLEMENTED, "The server was started without shared memory."
    SHARED_MEMORY_FULL = auto(), RESOURCE_EXHAUSTED, "There is no room left to make a shared-memory segment."
    TOO_MANY_SEGMENTS = auto(), RESOURCE_EXHAUSTED, "The tenant already holds as many registered segments as it may."
    SEGMENT_NOT_FOUND = auto(), NOT_FOUND, "The shared-memory segment does not exist."
    SEGMENT_NOT_REGISTERED = (auto(), PERMISSION_DENIED,
                              "The segment was not registered for this tenant, was handed over, or timed out.")
    BAD_SEGMENT = auto(), INVALID_ARGUMENT, "The segment cannot be opened, or is not the object that was registered."
    BAD_SEGMENT_NAME = auto(), INVALID_ARGUMENT, "A segment name is not one sparseserve makes."
    BAD_SEGMENT_SIZE = auto(), INVALID_ARGUMENT, "A segment size is negative."
    BAD_HEADER = auto(), INVALID_ARGUMENT, "A shared tensor's header is not a sparse or dense tensor, or carries data."

    # ---- auth
    MISSING_TOKEN = auto(), UNAUTHENTICATED, "The call carries no bearer token, and one is required."
    BAD_TOKEN = auto(), UNAUTHENTICATED, "The bearer token or client certificate names no tenant, or they disagree."

    # ---- serving
    OVERLOADED = auto(), UNAVAILABLE, "The server is at its concurrency and queue limits; retry later."
    SHUTTING_DOWN = auto(), UNAVAILABLE, "The server is shutting down."
    DEADLINE_PASSED = auto(), DEADLINE_EXCEEDED, "The caller's deadline passed and the work was abandoned."
    BODY_TIMEOUT = auto(), DEADLINE_EXCEEDED, "The request body stopped arriving for longer than the server waits."
    CALLER_CANCELLED = (auto(), CANCELLED,
                        "The caller stopped watching a call, so its work was abandoned; no one receives it.")

    # ---- the SDK (raised client-side)
    CONNECTION = auto(), UNAVAILABLE, "The SDK could not reach the server, or the connection was lost."
    TIMEOUT = auto(), DEADLINE_EXCEEDED, "No answer came within the SDK's timeout."
    NO_ANSWER = auto(), INTERNAL, "The server ended a progress stream without an answer."
    PROGRESS_NEEDS_GRPC = auto(), UNIMPLEMENTED, "Progress reports need the gRPC wire; the target speaks REST."
    SHARED_MEMORY_NEEDS_GRPC = (auto(), UNIMPLEMENTED,
                                "Shared-memory transfers need the gRPC wire; the target speaks REST.")
