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

/// Why [`Users::retire`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retire {
    /// Retired already.
    Gone,
    /// Objects still use it.
    InUse,
}

/// What other objects hold and its destroy waits for: a PD (its MRs, QPs, AHs, SRQs), an XRC
/// domain (its SRQs and target QPs). A hold counts itself and then looks for the retirement; a
/// retirement marks itself and then looks for holds. SeqCst, all four: each side stores, then
/// loads what the other stores (a store-buffering handshake, which weaker orders let both
/// sides miss: a QP made on a PD deallocated at the same moment).
#[derive(Debug, Default)]
pub(crate) struct Users {
    count: std::sync::atomic::AtomicU32,
    gone: std::sync::atomic::AtomicBool,
}

impl Users {
    /// One more user; false (and not counted) once retired.
    pub fn hold(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.count.fetch_add(1, SeqCst);
        if self.gone.load(SeqCst) {
            self.count.fetch_sub(1, SeqCst);
            return false;
        }
        true
    }

    pub fn release(&self) {
        self.count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether it was retired.
    pub fn gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Retires it, unless it is retired already or anything holds it.
    pub fn retire(&self) -> std::result::Result<(), Retire> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.gone.swap(true, SeqCst) {
            return Err(Retire::Gone);
        }
        if self.count.load(SeqCst) != 0 {
            self.gone.store(false, SeqCst);
            return Err(Retire::InUse);
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::{Retire, Users};

    /// A held object is not retired (and stays usable); released, it is, once; retired, it
    /// takes no hold.
    #[test]
    fn users_retire_only_when_nothing_holds() {
        let u = Users::default();
        assert!(u.hold());
        assert_eq!(u.retire(), Err(Retire::InUse));
        assert!(!u.gone(), "a refused retirement leaves it usable");
        assert!(u.hold());
        u.release();
        u.release();
        assert_eq!(u.retire(), Ok(()));
        assert!(u.gone());
        assert!(!u.hold(), "no hold once retired");
        assert_eq!(u.retire(), Err(Retire::Gone));
    }
}
