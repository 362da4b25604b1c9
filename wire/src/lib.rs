//! The fedge wire format, protocol version 10 (and 9, the previous one, for rolling upgrades:
//! [`compat`]).
//!
//! This crate defines what travels between devices and the coordinator: the binary messages
//! (round task, client update), the JSON status documents, the envelope that frames every
//! binary payload (magic, protocol version, message kind, CRC32), HMAC-SHA256 tags with
//! per-device keys (`Sealed`), the MQTT topic names, the
//! f32 tensor codec and the chunking of payloads larger than a broker's packet limit.
//!
//! It also holds the flat parameter layout of the head ([`layout`]), so that the coordinator
//! counts and initialises parameters without an ML framework.
//!
//! It knows nothing of MQTT clients, tokio, Burn or the file system: it turns values into
//! bytes and bytes into values.
//! Decoding never panics, whatever the input; it returns a [`DecodeError`] instead.

mod auth;
mod chunk;
pub mod compat;
pub mod control;
pub mod enrol;
mod envelope;
mod error;
mod frames;
pub mod head_check;
pub mod hex;
pub mod layout;
mod messages;
mod model;
pub mod paired;
pub mod previous;
mod serving;
pub mod site_stats;
mod site_variant;
mod status;
mod tensor;
mod topics;
mod train;

pub use auth::{AuthError, DeviceKey, KEY_LEN, KeyError, seal};
pub use chunk::{
    DEFAULT_MAX_PACKET, DEFAULT_MAX_PENDING, DEFAULT_REASSEMBLY_TIMEOUT_MS, MAX_PENDING_PER_SENDER,
    Reassembler, split_into_chunks, split_into_tagged_chunks,
};
pub use envelope::{
    Frame, Kind, MAGIC, MAX_MESSAGE_BYTES, Message, PREVIOUS_PROTOCOL_VERSION, PROTOCOL_VERSION,
    decode, decode_checked, decode_frame, encode, encode_as, frame_version,
};
pub use error::{DecodeError, UnknownName};
pub use frames::{
    TaskError, decode_backbone, decode_pointer, decode_release, decode_release_within, decode_task,
};
pub use head_check::HeadCheck;
pub use layout::{FlatLayoutError, HeadConfig, HeadTensors, ModelLayout};
pub use messages::{
    BackboneObject, BackboneRef, Chunk, ClassStats, ClientUpdate, FeatureNorm, InvalidTrain,
    LocalMetrics, MAX_BATCH_SIZE, MAX_LOCAL_EPOCHS, MAX_STABLE_BATCHES, Objective, RoundTask,
    Sealed, StableSchedule, Tag, TrainParams,
};
pub use model::{
    InvalidClasses, InvalidRelease, MAX_CLASS_NAME, MAX_CLASSES, ModelRelease, PairedScore, Role,
    SiteEvaluation, check_classes, numbered_classes,
};
pub use serving::{MAX_CANARIES, ServingPointer, Stage, decode_serving};
pub use site_stats::{
    Familiarity, FeatureStats, FeatureSummary, MIN_CLASS_DEVICES, MIN_CLASS_ROWS,
};
pub use site_variant::{SiteAdapt, SiteChoice, SiteVariant};
pub use status::{
    AuditHead, BufferStatus, CoordinatorStatus, Declined, DriftStatus, EdgeStatus, GateOutcome,
    GateVerdict, LabellingStatus, RejectCounts, ReleaseRef, ReleaseStatus, RunSummary,
};
pub use tensor::{Codec, TensorF32, Values, f16_to_f32, f32_to_f16};
pub use topics::{Topics, valid_client_id};
