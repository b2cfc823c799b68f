from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    BOOL: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    UINT16: _ClassVar[DType]
    UINT32: _ClassVar[DType]
    UINT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    COMPLEX64: _ClassVar[DType]
    COMPLEX128: _ClassVar[DType]

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_UNSPECIFIED: _ClassVar[Layout]
    COO: _ClassVar[Layout]
    CSR: _ClassVar[Layout]
    CSC: _ClassVar[Layout]
    BSR: _ClassVar[Layout]
    BSC: _ClassVar[Layout]
DTYPE_UNSPECIFIED: DType
BOOL: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
UINT8: DType
UINT16: DType
UINT32: DType
UINT64: DType
FLOAT16: DType
FLOAT32: DType
FLOAT64: DType
COMPLEX64: DType
COMPLEX128: DType
LAYOUT_UNSPECIFIED: Layout
COO: Layout
CSR: Layout
CSC: Layout
BSR: Layout
BSC: Layout

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data", "padding")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    padding: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., padding: _Optional[bytes] = ...) -> None: ...

class SparseTensor(_message.Message):
    __slots__ = ("layout", "dense_shape", "indices", "values", "compressed_indices", "plain_indices", "blocksize", "coalesced")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DENSE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_INDICES_FIELD_NUMBER: _ClassVar[int]
    PLAIN_INDICES_FIELD_NUMBER: _ClassVar[int]
    BLOCKSIZE_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    layout: Layout
    dense_shape: _containers.RepeatedScalarFieldContainer[int]
    indices: Array
    values: Array
    compressed_indices: Array
    plain_indices: Array
    blocksize: _containers.RepeatedScalarFieldContainer[int]
    coalesced: bool
    def __init__(self, layout: _Optional[_Union[Layout, str]] = ..., dense_shape: _Optional[_Iterable[int]] = ..., indices: _Optional[_Union[Array, _Mapping]] = ..., values: _Optional[_Union[Array, _Mapping]] = ..., compressed_indices: _Optional[_Union[Array, _Mapping]] = ..., plain_indices: _Optional[_Union[Array, _Mapping]] = ..., blocksize: _Optional[_Iterable[int]] = ..., coalesced: _Optional[bool] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("sparse", "dense", "handle", "info")
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    sparse: SparseTensor
    dense: Array
    handle: str
    info: TensorInfo
    def __init__(self, sparse: _Optional[_Union[SparseTensor, _Mapping]] = ..., dense: _Optional[_Union[Array, _Mapping]] = ..., handle: _Optional[str] = ..., info: _Optional[_Union[TensorInfo, _Mapping]] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("layout", "dense", "dtype", "shape", "nnz", "nbytes")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NNZ_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    layout: Layout
    dense: bool
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    nnz: int
    nbytes: int
    def __init__(self, layout: _Optional[_Union[Layout, str]] = ..., dense: _Optional[bool] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., nnz: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, Value]
    def __init__(self, entries: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("tensor", "bool_value", "int_value", "float_value", "string_value", "list_value", "null_value", "ref", "map_value")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    tensor: Tensor
    bool_value: bool
    int_value: int
    float_value: float
    string_value: str
    list_value: ValueList
    null_value: bool
    ref: str
    map_value: ValueMap
    def __init__(self, tensor: _Optional[_Union[Tensor, _Mapping]] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ..., list_value: _Optional[_Union[ValueList, _Mapping]] = ..., null_value: _Optional[bool] = ..., ref: _Optional[str] = ..., map_value: _Optional[_Union[ValueMap, _Mapping]] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("op", "args", "keep")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    OP_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    op: str
    args: _containers.MessageMap[str, Value]
    keep: bool
    def __init__(self, op: _Optional[str] = ..., args: _Optional[_Mapping[str, Value]] = ..., keep: _Optional[bool] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "tensor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: Tensor
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    def __init__(self, outputs: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ...) -> None: ...

class PipelineStep(_message.Message):
    __slots__ = ("name", "op", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    args: _containers.MessageMap[str, Value]
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., args: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class PipelineRequest(_message.Message):
    __slots__ = ("steps", "outputs", "keep")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[PipelineStep]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    keep: bool
    def __init__(self, steps: _Optional[_Iterable[_Union[PipelineStep, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ..., keep: _Optional[bool] = ...) -> None: ...

class SharedTensor(_message.Message):
    __slots__ = ("segment", "header")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    segment: str
    header: Tensor
    def __init__(self, segment: _Optional[str] = ..., header: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class RegisterSegmentRequest(_message.Message):
    __slots__ = ("nbytes",)
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    nbytes: int
    def __init__(self, nbytes: _Optional[int] = ...) -> None: ...

class RegisterSegmentResponse(_message.Message):
    __slots__ = ("segment", "ttl_seconds")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    segment: str
    ttl_seconds: float
    def __init__(self, segment: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: Tensor
    data: bytes
    def __init__(self, header: _Optional[_Union[Tensor, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class MessageFrame(_message.Message):
    __slots__ = ("total_bytes", "data")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    data: bytes
    def __init__(self, total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Handle(_message.Message):
    __slots__ = ("handle", "nbytes")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    handle: str
    nbytes: int
    def __init__(self, handle: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: str
    def __init__(self, handle: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListOpsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ArgDef(_message.Message):
    __slots__ = ("name", "type", "required", "default", "doc", "layouts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    required: bool
    default: Value
    doc: str
    layouts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., required: _Optional[bool] = ..., default: _Optional[_Union[Value, _Mapping]] = ..., doc: _Optional[str] = ..., layouts: _Optional[_Iterable[str]] = ...) -> None: ...

class OutputDef(_message.Message):
    __slots__ = ("name", "type", "doc")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    doc: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., doc: _Optional[str] = ...) -> None: ...

class OpDef(_message.Message):
    __slots__ = ("name", "doc", "args", "outputs", "iterative")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ITERATIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    doc: str
    args: _containers.RepeatedCompositeFieldContainer[ArgDef]
    outputs: _containers.RepeatedCompositeFieldContainer[OutputDef]
    iterative: bool
    def __init__(self, name: _Optional[str] = ..., doc: _Optional[str] = ..., args: _Optional[_Iterable[_Union[ArgDef, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[OutputDef, _Mapping]]] = ..., iterative: _Optional[bool] = ...) -> None: ...

class ListOpsResponse(_message.Message):
    __slots__ = ("ops", "device")
    OPS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[OpDef]
    device: str
    def __init__(self, ops: _Optional[_Iterable[_Union[OpDef, _Mapping]]] = ..., device: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("op", "iteration", "residual_norm")
    OP_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_NORM_FIELD_NUMBER: _ClassVar[int]
    op: str
    iteration: int
    residual_norm: float
    def __init__(self, op: _Optional[str] = ..., iteration: _Optional[int] = ..., residual_norm: _Optional[float] = ...) -> None: ...

class ExecuteProgress(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: Progress
    result: ExecuteResponse
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., result: _Optional[_Union[ExecuteResponse, _Mapping]] = ...) -> None: ...
