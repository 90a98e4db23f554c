//! Work queue entries as the transport executes them: the SQ operations and the table of
//! which ones each service type accepts (WR-SQ), the send and receive WQEs the queues hold,
//! and the Bind MW request a send WQE may carry, and the requester's transmit state of a
//! send WQE (`WqeTx`: its PSNs, status and checked buffers). The verbs layer fills them from
//! the consumer's work requests (`verbs::wr`); this file imports nothing else of the
//! transport.

use std::any::Any;
use std::sync::Arc;

use crate::mem::MemRef;
use crate::types::{Access, AhAttr, QpType, Sge, WcStatus};
use crate::wire::psn::Psn;

/// SQ operation (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WrOpcode {
    #[default]
    Send,
    SendWithImm,
    SendWithInv,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    AtomicCmpSwp,
    AtomicFetchAdd,
    /// Atomic Write (IBA 1.5, `IBV_WR_ATOMIC_WRITE`): its 8 bytes of data (inline or from the
    /// gather list) stored at the remote address in one atomic store.
    AtomicWrite,
    BindMw,
    LocalInv,
    /// Fast Register: makes a fast-registration region's keys valid (see `Pd::alloc_fast_reg_mr`).
    FastReg,
    /// RD Resync: started only by an EEC's send logic, never accepted from a consumer (WR-SQ-7).
    Resync,
}

impl WrOpcode {
    /// Compare & Swap and Fetch & Add: no payload out, 8 bytes back into the one local buffer.
    pub fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }

    /// Answered by a response of its own (Read responses, an Atomic ACK, Atomic Write's empty
    /// Read response) rather than acknowledged by any later ACK: the operations that take one
    /// of the responder's resources, so they count against the initiator depth (WR-READ-3,
    /// `max_rd_atomic`), the Fence waits for them (WR-COM-6), and an ACK past one unanswered
    /// means its response was lost (PKT-ACK-7).
    pub fn awaits_response(self) -> bool {
        matches!(self, WrOpcode::RdmaRead | WrOpcode::AtomicWrite) || self.is_atomic()
    }

    /// Whether its message takes a receive WQE at the responder: what end-to-end credits
    /// count (IBA 9.7.7.2).
    pub fn consumes_rq_wqe(self) -> bool {
        matches!(self, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::RdmaWriteWithImm)
    }

    pub fn has_imm(self) -> bool {
        matches!(self, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm)
    }

    /// Operations that carry data from a gather list.
    pub fn gathers(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
                | WrOpcode::AtomicWrite
        )
    }
}

/// WR-SQ: may an SQ of `qp_type` carry `op`? One row per operation, columns RC, XRC (an
/// initiator: what RC posts, each message for the SRQ its WR names, but Atomic Write, which
/// has no XRC opcode), UC, UD, RD, Raw. An XRC target has no send queue.
pub fn wr_allowed(qp_type: QpType, op: WrOpcode) -> bool {
    const T: bool = true;
    const F: bool = false;
    #[rustfmt::skip]
    let row: [bool; 6] = match op {
        //                                 RC XRC UC UD RD Raw
        WrOpcode::Send =>                 [T, T, T, T, T, T],
        WrOpcode::SendWithImm =>          [T, T, T, T, T, F], // WR-SQ-6
        WrOpcode::SendWithInv =>          [T, T, F, F, F, F],
        WrOpcode::RdmaWrite |
        WrOpcode::RdmaWriteWithImm =>     [T, T, T, F, T, F],
        WrOpcode::RdmaRead =>             [T, T, F, F, T, F],
        WrOpcode::AtomicCmpSwp |
        WrOpcode::AtomicFetchAdd =>       [T, T, F, F, T, F],
        WrOpcode::AtomicWrite =>          [T, F, F, F, F, F], // IBA 1.5: RC's opcode only
        WrOpcode::BindMw |
        WrOpcode::LocalInv =>             [T, T, T, F, T, F],
        WrOpcode::FastReg =>              [T, T, T, T, T, F],
        WrOpcode::Resync =>               [F, F, F, F, F, F],
    };
    let col = match qp_type {
        QpType::Rc => 0,
        QpType::XrcSend => 1,
        QpType::XrcRecv => return false,
        QpType::Uc => 2,
        QpType::Ud => 3,
        QpType::Rd => 4,
        QpType::RawIpv6 | QpType::RawEthertype => 5,
    };
    row[col]
}

bitflags::bitflags! {
    /// `ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        const FENCE = 1 << 0;
        const SIGNALED = 1 << 1;
        const SOLICITED = 1 << 2;
        const INLINE = 1 << 3;
    }
}

/// A queued Send WQE, owned by the QP. Slots are reused, so posting does not allocate once the
/// queue has warmed up.
///
/// Laid out in declaration order (`repr(C)`): what every WR fills and the requester reads
/// comes first, in the first three cache lines; the fields of the rarer kinds of WR (UD,
/// RD, Atomic, Send with Invalidate, Local Invalidate, Bind MW, Fast Register, Raw) come
/// after, and a post writes them only when its WR has them or the slot's last WR had them
/// (`rare`). With thousands of QPs a slot is cold when it is posted to, and every line a post
/// touches is one more miss.
#[derive(Debug, Clone, Default)]
#[repr(C)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    /// Message length: the gather list's (or inline data's) total, or the RDMA Read length.
    pub length: u64,
    pub remote_addr: u64,
    pub sges: SgeList,
    pub inline: Vec<u8>,
    /// The requester's state of this WQE.
    pub tx: WqeTx,
    pub rkey: u32,
    pub imm_data: u32,
    pub opcode: WrOpcode,
    pub flags: SendFlags,
    /// Whether a successful completion produces a CQE (WR-COM-2, WR-COM-3).
    pub signaled: bool,
    /// Some field below holds a value a WR gave it (not its default).
    pub rare: bool,
    pub compare_add: u64,
    pub swap: u64,
    /// UD: the address vector, copied from the address handle at post time.
    pub ah: Option<AhAttr>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// XRC: the SRQ at the target the message is for (its XRCETH).
    pub xrc_srqn: u32,
    pub eecn: u32,
    pub invalidate_rkey: u32,
    pub bind: Option<BindRequest>,
    /// What a Fast Register WQE registers.
    pub fast_reg: Option<FastRegRequest>,
    /// Raw Ethertype: the EtherType the WR names, written into the frame (WR-SEND-8).
    pub raw_ethertype: Option<u16>,
}

/// A WQE's gather or scatter list. One SGE (what nearly every WR carries) lives inside the
/// WQE, in the same 24 bytes a `Vec` takes: a QP's packet then reads no other allocation for
/// it, which with thousands of QPs was one more cache miss per message at the requester and
/// at the responder. More SGEs go to the heap, reserved at QP creation (no allocation per post).
pub(crate) type SgeList = smallvec::SmallVec<[Sge; 1]>;

/// A queued Receive WQE.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: SgeList,
    pub length: u64,
}

/// Appends a WR's SGEs to a WQE's list, one push each: a WR has one SGE or two, and
/// SmallVec's `extend_from_slice` (an insert at the end) is a call and a `memcpy` for them.
pub(crate) fn push_sges(list: &mut SgeList, sges: &[Sge]) {
    for &s in sges {
        list.push(s);
    }
}

/// The bytes a list of SGEs covers.
pub(crate) fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| s.length as u64).sum()
}

/// A Fast Register request as the requester executes it: the region's current key (the
/// consumer names it), the key byte its keys get, and the rights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastRegRequest {
    pub key: u32,
    pub new_key: u8,
    pub access: Access,
}

/// A Bind MW request as the requester executes it.
#[derive(Clone)]
pub(crate) struct BindRequest {
    /// The window, opaque to the transport: the verbs layer that made the request binds it.
    pub mw: Arc<dyn Any + Send + Sync>,
    /// The window's R_Key the consumer named: it must be the current one.
    pub rkey: u32,
    pub mr_key: u32,
    pub addr: u64,
    pub length: u64,
    pub access: Access,
    /// The key byte the consumer chose for the window's next R_Key, if it did.
    pub new_key: Option<u8>,
}

impl std::fmt::Debug for BindRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BindRequest")
            .field("rkey", &self.rkey)
            .field("addr", &self.addr)
            .field("length", &self.length)
            .finish()
    }
}

impl RecvWqe {
    /// Fills a reused slot from `wr`, keeping its SGE list's allocation.
    pub(crate) fn fill(&mut self, wr_id: u64, sges: &[Sge]) {
        self.wr_id = wr_id;
        self.sges.clear();
        push_sges(&mut self.sges, sges);
        self.length = sge_total(sges);
    }
}

/// The requester's view of one SQ WQE.
#[derive(Debug, Default, Clone)]
pub(crate) struct WqeTx {
    /// PSN of its first request packet (for an RDMA Read, of its first response).
    pub first_psn: u32,
    /// PSNs it uses: request packets, or response packets for an RDMA Read (PKT-PSN-2).
    pub npkts: u32,
    /// Set once the WQE is done, successfully or not; it retires when it reaches the head.
    pub status: Option<WcStatus>,
    /// UC/UD: its last packet was handed to the link, which has not yet said it left (see
    /// `Engine::sent`); the WQE completes then.
    pub awaiting_wire: bool,
    /// RDMA Read: response packets received so far.
    pub resp_received: u32,
    /// The checked local buffers: the gather list of a Send or Write, the scatter list of a
    /// Read or Atomic; and the device's key generation read before they were checked (see
    /// `requester::recheck_local`).
    pub local: Vec<MemRef>,
    pub local_gen: u64,
}

impl WqeTx {
    pub fn last_psn(&self) -> Psn {
        Psn::new(self.first_psn).add(self.npkts.max(1) - 1)
    }

    pub fn contains(&self, psn: Psn) -> bool {
        psn.in_range(Psn::new(self.first_psn), self.last_psn())
    }
}
