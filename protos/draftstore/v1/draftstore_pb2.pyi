from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_STATIC: _ClassVar[Tier]
    TIER_LIVE: _ClassVar[Tier]
    TIER_BOTH: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_STATIC: Tier
TIER_LIVE: Tier
TIER_BOTH: Tier

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Tokenizer(_message.Message):
    __slots__ = ("name", "fingerprint", "vocab_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    vocab_size: int
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("format_version", "tokenizer", "tokens", "documents", "shards", "token_dtype", "live_tokens", "live_sequences", "max_budget", "max_depth", "max_context", "max_batch")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    tokenizer: Tokenizer
    tokens: int
    documents: int
    shards: int
    token_dtype: str
    live_tokens: int
    live_sequences: int
    max_budget: int
    max_depth: int
    max_context: int
    max_batch: int
    def __init__(self, format_version: _Optional[int] = ..., tokenizer: _Optional[_Union[Tokenizer, _Mapping]] = ..., tokens: _Optional[int] = ..., documents: _Optional[int] = ..., shards: _Optional[int] = ..., token_dtype: _Optional[str] = ..., live_tokens: _Optional[int] = ..., live_sequences: _Optional[int] = ..., max_budget: _Optional[int] = ..., max_depth: _Optional[int] = ..., max_context: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class DraftParams(_message.Message):
    __slots__ = ("budget", "max_depth", "max_suffix", "min_suffix", "tier", "min_count")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    MIN_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    budget: int
    max_depth: int
    max_suffix: int
    min_suffix: int
    tier: Tier
    min_count: int
    def __init__(self, budget: _Optional[int] = ..., max_depth: _Optional[int] = ..., max_suffix: _Optional[int] = ..., min_suffix: _Optional[int] = ..., tier: _Optional[_Union[Tier, str]] = ..., min_count: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("context", "params", "tokenizer_fingerprint")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    context: _containers.RepeatedScalarFieldContainer[int]
    params: DraftParams
    tokenizer_fingerprint: str
    def __init__(self, context: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[DraftParams, _Mapping]] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class DraftTree(_message.Message):
    __slots__ = ("tokens", "parents", "counts", "match_len")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    MATCH_LEN_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    match_len: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., match_len: _Optional[int] = ...) -> None: ...

class DraftResponse(_message.Message):
    __slots__ = ("tree",)
    TREE_FIELD_NUMBER: _ClassVar[int]
    tree: DraftTree
    def __init__(self, tree: _Optional[_Union[DraftTree, _Mapping]] = ...) -> None: ...

class DraftBatchRequest(_message.Message):
    __slots__ = ("requests", "tokenizer_fingerprint")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[DraftRequest]
    tokenizer_fingerprint: str
    def __init__(self, requests: _Optional[_Iterable[_Union[DraftRequest, _Mapping]]] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class DraftBatchResponse(_message.Message):
    __slots__ = ("trees",)
    TREES_FIELD_NUMBER: _ClassVar[int]
    trees: _containers.RepeatedCompositeFieldContainer[DraftTree]
    def __init__(self, trees: _Optional[_Iterable[_Union[DraftTree, _Mapping]]] = ...) -> None: ...

class TokenSequence(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class InsertRequest(_message.Message):
    __slots__ = ("sequences", "tokenizer_fingerprint")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    tokenizer_fingerprint: str
    def __init__(self, sequences: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class InsertResponse(_message.Message):
    __slots__ = ("sequences", "tokens")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    sequences: int
    tokens: int
    def __init__(self, sequences: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...
