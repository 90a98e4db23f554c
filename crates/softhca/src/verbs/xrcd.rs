//! XRC domains (`ibv_xrcd`, IBA Annex A14): the scope in which XRC target QPs and XRC SRQs
//! meet. An XRC initiator's message names an SRQ at the target by number (its XRCETH); the
//! target QP takes it only if that SRQ is in the QP's domain, and the SRQ then gives the
//! message its receive WQE, its PD (for every key the message uses) and its CQ.
//!
//! A target QP has no PD, CQs or work queues of its own. So that a QP's resources stay what
//! they are for every other service type, the domain lends its target QPs a PD and a CQ of its
//! own, which no key names and no completion reaches.

use std::sync::Arc;

use super::cq::Cq;
use super::device::{Context, DeviceInner};
use super::error::{Result, VerbsError};
use super::pd::Pd;
use super::qp::{Qp, QpInitAttr};
use super::types::QpType;
use super::{Retire, Users};
use crate::transport::qp::QpCap;

pub(crate) struct XrcdInner {
    pub handle: u32,
    pub dev: Arc<DeviceInner>,
    /// XRC SRQs and target QPs in the domain, not yet destroyed: Close XRC Domain waits for
    /// none (the kernel's `usecnt`, EBUSY).
    users: Users,
    /// Lent to the target QPs (module doc).
    tgt_pd: Pd,
    tgt_cq: Cq,
}

impl XrcdInner {
    pub fn check(&self) -> Result<()> {
        self.dev.check_open()?;
        if self.users.gone() {
            return Err(VerbsError::InvalidArgument("closed XRC domain"));
        }
        Ok(())
    }

    /// Records one more SRQ or target QP in the domain; fails if it was closed meanwhile.
    pub fn hold(&self) -> Result<()> {
        self.users.hold().then_some(()).ok_or(VerbsError::InvalidArgument("closed XRC domain"))
    }

    pub fn release(&self) {
        self.users.release();
    }
}

/// An XRC domain (`ibv_xrcd`).
#[derive(Clone)]
pub struct Xrcd {
    pub(crate) inner: Arc<XrcdInner>,
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xrcd").field("handle", &self.inner.handle).finish()
    }
}

impl PartialEq for Xrcd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Context {
    /// Open XRC Domain: a new one. (Sharing one between processes through a file, as
    /// `ibv_open_xrcd` does, is the drop-in's: a device here belongs to one process.)
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        self.inner.check_open()?;
        if !self.inner.attr.xrc {
            return Err(VerbsError::NotSupported("XRC"));
        }
        let tgt_pd = self.alloc_pd()?;
        let tgt_cq = match self.create_cq(1) {
            Ok(cq) => cq,
            Err(e) => {
                let _ = tgt_pd.dealloc();
                return Err(e);
            }
        };
        Ok(Xrcd {
            inner: Arc::new(XrcdInner {
                handle: self.inner.new_handle(),
                dev: self.inner.clone(),
                users: Users::default(),
                tgt_pd,
                tgt_cq,
            }),
        })
    }
}

impl Xrcd {
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// Close XRC Domain: `InUse` while an XRC SRQ or target QP is in it.
    pub fn close(&self) -> Result<()> {
        self.inner.dev.check_open()?;
        match self.inner.users.retire() {
            Ok(()) => {}
            Err(Retire::Gone) => return Err(VerbsError::InvalidArgument("XRC domain already closed")),
            Err(Retire::InUse) => return Err(VerbsError::InUse("XRC domain has SRQs or target QPs")),
        }
        let _ = self.inner.tgt_cq.destroy();
        let _ = self.inner.tgt_pd.dealloc();
        Ok(())
    }

    /// Create QP of type XRC target (`IBV_QPT_XRC_RECV`) in this domain. It has no work
    /// queues: its messages take their receive WQEs from the XRC SRQs they name.
    pub fn create_tgt_qp(&self) -> Result<Qp> {
        self.inner.check()?;
        let cq = &self.inner.tgt_cq;
        let mut init = QpInitAttr::new(QpType::XrcRecv, cq, cq);
        init.cap = QpCap::default();
        self.inner.tgt_pd.context().create_xrc_tgt_qp(&self.inner.tgt_pd, &init, self)
    }
}
