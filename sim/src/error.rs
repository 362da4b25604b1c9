//! Why a node could not be added or restarted.

/// A node could not be added or restarted.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An invalid federation name.
    #[error(transparent)]
    Topics(#[from] fedge_wire::DecodeError),
    /// A device's identity is invalid.
    #[error(transparent)]
    Agent(#[from] fedge_device::InvalidIdentity),
    /// A coordinator cannot start from its plan or its checkpoint.
    #[error(transparent)]
    Boot(#[from] fedge_coordinator::boot::BootError),
}
