"""The Streams client-side task assignor, its placement of replicas and its KIP-848 metadata."""

from .metadata import (
    CLASSIC_METADATA_VERSION,
    MAXIMUM_METADATA_VERSION,
    METADATA_VERSION,
    MINIMUM_METADATA_VERSION,
    AssignmentError,
    ClassicStreamsMemberMetadata,
    MemberReason,
    MetadataDecodeError,
    StreamsAssignmentMetadata,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    decode_member_metadata,
    encode_assignment_metadata,
    encode_member_metadata,
)
from .placement import HaConfig, MemberTasks, ProcessSpec, place_tasks
from .sticky import ASSIGNOR_NAME, StickyTaskAssignor

__all__ = [
    "ASSIGNOR_NAME",
    "CLASSIC_METADATA_VERSION",
    "MAXIMUM_METADATA_VERSION",
    "METADATA_VERSION",
    "MINIMUM_METADATA_VERSION",
    "AssignmentError",
    "ClassicStreamsMemberMetadata",
    "HaConfig",
    "MemberTasks",
    "ProcessSpec",
    "MemberReason",
    "MetadataDecodeError",
    "StickyTaskAssignor",
    "StreamsAssignmentMetadata",
    "StreamsMemberMetadata",
    "decode_assignment_metadata",
    "decode_member_metadata",
    "encode_assignment_metadata",
    "encode_member_metadata",
    "place_tasks",
]
