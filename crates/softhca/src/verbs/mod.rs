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
/// domain (its SRQs and target QPs). One atomic word holds both the count of holds and the
/// retired bit, so a hold and a retirement each decide in one compare-and-swap: a retirement
/// succeeds only from "no holds, not retired", and a refused one changes nothing (a hold or a
/// `gone()` racing it never sees the object retired for a moment).
#[derive(Debug, Default)]
pub(crate) struct Users(std::sync::atomic::AtomicU32);

impl Users {
    /// The retired bit; the bits below it count holds.
    const GONE: u32 = 1 << 31;

    /// One more user; false (and not counted) once retired.
    pub fn hold(&self) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        self.0
            .fetch_update(AcqRel, Acquire, |v| {
                // A count that would reach the retired bit is refused too (2^31 holds).
                (v & Self::GONE == 0 && v + 1 < Self::GONE).then_some(v + 1)
            })
            .is_ok()
    }

    pub fn release(&self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether it was retired.
    pub fn gone(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) & Self::GONE != 0
    }

    /// Retires it, unless it is retired already or anything holds it.
    pub fn retire(&self) -> std::result::Result<(), Retire> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        match self.0.compare_exchange(0, Self::GONE, AcqRel, Acquire) {
            Ok(_) => Ok(()),
            Err(v) if v & Self::GONE != 0 => Err(Retire::Gone),
            Err(_) => Err(Retire::InUse),
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

    /// Refused retirements racing holds and looks: while something holds it, no other thread
    /// ever sees it retired or has a hold refused.
    #[test]
    fn a_refused_retirement_is_never_seen() {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let u = std::sync::Arc::new(Users::default());
        assert!(u.hold());
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let looker = {
            let (u, done) = (u.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                for _ in 0..500_000 {
                    if u.gone() || !u.hold() {
                        seen += 1;
                    } else {
                        u.release();
                    }
                }
                done.store(true, Relaxed);
                seen
            })
        };
        // Retire until the looker is through, so the two overlap whatever the scheduler does.
        while !done.load(Relaxed) {
            assert_eq!(u.retire(), Err(Retire::InUse));
        }
        assert_eq!(looker.join().unwrap(), 0, "seen retired while held");
        u.release();
        assert_eq!(u.retire(), Ok(()));
    }
}
