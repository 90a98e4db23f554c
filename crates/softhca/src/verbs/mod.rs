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

pub use ah::Ah;
pub use cm_agent::CmAgent;
pub use cq::{CompChannel, Cq};
pub use device::{
    device_list, open_device, AtomicCap, Context, DeviceAttr, DeviceConfig, DeviceInfo, PortAttr, PortState, Progress,
};
pub use eec::{Eec, EecAttr, EecAttrs, Rdd};
pub use error::{PostError, Result, VerbsError};
pub use mr::{AccessError, MemRef, Mr};
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{AltPath, Qp, QpAttr, QpAttrs, QpCap, QpInitAttr, WqSizes, MAX_MSG_SIZE};
pub use srq::{Srq, SrqAttr, SrqInitAttr};
pub use types::*;
pub use wr::{FastRegWr, MwBind, RawFields, RecvWr, SendFlags, SendWr, WrOpcode};
