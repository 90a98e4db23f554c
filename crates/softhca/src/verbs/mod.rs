//! The verbs: device, protection domains, memory regions and windows, address handles,
//! completion queues, shared receive queues, queue pairs and EECs, with the results of
//! `spec/RULES.md`.
//!
//! This layer owns the resources and their checks (handles, counts, keys, the CQ rings, the
//! async event queue, the consumer's callbacks) and implements the transport's narrow
//! interface (`transport::hca`) over them. It imports the transport, `wire` and the ground
//! floor; nothing below imports it. The consumer's callbacks run after an engine step, never
//! inside one (`callbacks`).

pub use crate::{error, types};

pub mod ah;
pub mod cm_agent;
pub mod cq;
pub mod device;
pub mod eec;
pub(crate) mod effects;
mod eventfd;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod wr;
pub mod xrcd;

/// Shared (in an `Arc`) by every clone of a handle whose object the device's own tables hold
/// too (a QP, an EEC, a memory window): when the last clone is dropped, `release` destroys the
/// object as if the program had, unless it already did. The tables hold the object and the
/// object holds the device, so an object no handle names any more would otherwise keep
/// itself and the whole device for the life of the process. Runs even on a closed device.
pub(crate) struct LastHandle(Option<Box<dyn FnOnce() + Send + Sync>>);

impl LastHandle {
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> std::sync::Arc<LastHandle> {
        std::sync::Arc::new(LastHandle(Some(Box::new(release))))
    }
}

impl Drop for LastHandle {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            // Handlers and wake-ups the release queues run once it is over (see `effects`).
            effects::scope(release);
        }
    }
}

pub use ah::Ah;
pub use cm_agent::CmAgent;
pub use cq::{CompChannel, Cq};
pub use device::{
    device_list, open_device, AtomicCap, Context, DeviceAttr, DeviceConfig, DeviceInfo, GroupListener, PortAttr,
    PortState, Progress, RawListener,
};
pub use eec::{Eec, EecAttr, EecAttrs, Rdd};
pub use error::{PostError, Result, VerbsError};
pub use mr::{AccessError, MemRef, Mr};
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{AltPath, Qp, QpAttr, QpAttrs, QpCap, QpInitAttr, WqSizes};
pub use srq::{Srq, SrqAttr, SrqInitAttr};
pub use types::*;
pub use wr::{FastRegWr, MwBind, RawFields, RecvWr, SendFlags, SendWr, WrOpcode, MAX_MSG_SIZE};
pub use xrcd::Xrcd;
