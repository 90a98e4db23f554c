//! Address Handles: where a UD Send goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::device::{give, take, DeviceInner};
use super::error::{Result, VerbsError};
use super::pd::{Pd, PdInner};
use super::types::AhAttr;
use crate::types::AttrMask;

pub(crate) struct AhInner {
    pub handle: u32,
    pub pd: Arc<PdInner>,
    pub attr: AhAttr,
    destroyed: AtomicBool,
}

/// An address handle (`ibv_ah`).
#[derive(Clone)]
pub struct Ah {
    pub(crate) inner: Arc<AhInner>,
}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").field("handle", &self.inner.handle).field("attr", &self.inner.attr).finish()
    }
}

/// Checks an address against the port: on RoCEv2 every packet carries network addressing, so
/// the GRH must be present and complete (PKT-ROCE-4, MOD-INIT-RTR-RC-5). A flow label wider
/// than the GRH's 20 bits is taken, as Linux takes it (the kernel stores the `u32`), and the
/// IPv6 header carries its low 20 bits: UCX sets `~path_index` there on RoCE, for
/// rdma-core's flow-label-to-UDP-source-port conversion, and stops if the AH is refused.
pub(crate) fn validate_ah_attr(dev: &DeviceInner, attr: &AhAttr, mask: AttrMask) -> Result<()> {
    if attr.is_global && !attr.grh.is_complete() {
        return Err(VerbsError::MissingAttribute(mask));
    }
    if !attr.is_global {
        return Err(VerbsError::InvalidAttribute(mask, "a RoCEv2 port needs the GRH (is_global)"));
    }
    if attr.port_num == 0 || attr.port_num > dev.attr.phys_port_cnt {
        return Err(VerbsError::InvalidAttribute(mask, "port number"));
    }
    let gids = dev.gids.read().unwrap_or_else(|e| e.into_inner()).len();
    if attr.grh.sgid_index.is_some_and(|i| i as usize >= gids) {
        return Err(VerbsError::InvalidAttribute(mask, "source GID index"));
    }
    if attr.sl > 15 {
        return Err(VerbsError::InvalidAttribute(mask, "service level is 4 bits"));
    }
    Ok(())
}

impl Pd {
    /// Create Address Handle.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        self.inner.check()?;
        let dev = &self.inner.dev;
        validate_ah_attr(dev, attr, AttrMask::AV)?;
        take(&dev.counts.ah, dev.attr.max_ah)?;
        if let Err(e) = self.inner.hold() {
            give(&dev.counts.ah);
            return Err(e);
        }
        Ok(Ah {
            inner: Arc::new(AhInner {
                handle: dev.new_handle(),
                pd: self.inner.clone(),
                attr: *attr,
                destroyed: AtomicBool::new(false),
            }),
        })
    }
}

impl Ah {
    pub fn attr(&self) -> AhAttr {
        self.inner.attr
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.inner.pd.dev.check_open()?;
        if self.inner.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::InvalidAhHandle);
        }
        Ok(())
    }

    /// Destroy Address Handle.
    pub fn destroy(&self) -> Result<()> {
        self.check()?;
        if self.inner.destroyed.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::InvalidAhHandle);
        }
        self.inner.pd.release();
        give(&self.inner.pd.dev.counts.ah);
        Ok(())
    }
}
