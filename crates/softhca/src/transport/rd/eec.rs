//! An End-to-End Context's transport state: its attributes and the send and receive logic of
//! its channel end. The verbs layer creates, modifies and destroys EECs (`verbs::eec`).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::transport::hca::Hca;
use crate::types::{AddressVector, QpState};

use super::EecEngine;

/// An EEC's current attributes (Query EEC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EecAttrs {
    pub state: QpState,
    pub pkey_index: u16,
    pub port_num: u8,
    pub av: Option<AddressVector>,
    pub dest_eecn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for EecAttrs {
    fn default() -> Self {
        EecAttrs {
            state: QpState::Reset,
            pkey_index: 0,
            port_num: 1,
            av: None,
            dest_eecn: 0,
            rq_psn: 0,
            sq_psn: 0,
            max_dest_rd_atomic: 0,
            max_rd_atomic: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

pub(crate) struct EecCore {
    pub destroyed: bool,
    pub attrs: EecAttrs,
    /// Send and receive logic of the channel end.
    pub engine: EecEngine,
}

pub(crate) struct EecInner {
    pub eecn: u32,
    /// The device above, through the transport's narrow interface.
    pub dev: Arc<dyn Hca>,
    /// The handle of the EEC's Reliable Datagram Domain.
    pub rdd: u32,
    pub core: Mutex<EecCore>,
}

impl EecInner {
    pub fn lock(&self) -> MutexGuard<'_, EecCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}
