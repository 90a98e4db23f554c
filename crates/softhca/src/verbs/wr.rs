//! Work requests as the consumer posts them (`ibv_send_wr`, `ibv_recv_wr`) and the table of
//! which SQ operations each service type accepts (WR-SQ).

use super::ah::Ah;
use super::types::{QpType, Sge};

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
    BindMw,
    LocalInv,
    /// RD Resync: started only by an EEC's send logic, never accepted from a consumer (WR-SQ-7).
    Resync,
}

impl WrOpcode {
    pub fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
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
        )
    }
}

/// WR-SQ: may an SQ of `qp_type` carry `op`? One row per operation, columns RC, UC, UD, RD, Raw.
pub fn wr_allowed(qp_type: QpType, op: WrOpcode) -> bool {
    const T: bool = true;
    const F: bool = false;
    #[rustfmt::skip]
    let row: [bool; 5] = match op {
        //                                 RC UC UD RD Raw
        WrOpcode::Send =>                 [T, T, T, T, T],
        WrOpcode::SendWithImm =>          [T, T, T, T, F], // WR-SQ-6
        WrOpcode::SendWithInv =>          [T, F, F, F, F],
        WrOpcode::RdmaWrite |
        WrOpcode::RdmaWriteWithImm =>     [T, T, F, T, F],
        WrOpcode::RdmaRead =>             [T, F, F, T, F],
        WrOpcode::AtomicCmpSwp |
        WrOpcode::AtomicFetchAdd =>       [T, F, F, T, F],
        WrOpcode::BindMw |
        WrOpcode::LocalInv =>             [T, T, F, T, F],
        WrOpcode::Resync =>               [F, F, F, F, F],
    };
    let col = match qp_type {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud => 2,
        QpType::Rd => 3,
        QpType::RawIpv6 | QpType::RawEthertype => 4,
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

/// A Send Queue work request. Build it with the constructors and chain the modifiers:
/// `SendWr::rdma_write(1, &sges, va, rkey).signaled()`.
#[derive(Debug, Clone, Default)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub send_flags: SendFlags,
    pub sg_list: &'a [Sge],
    /// The message itself when `send_flags` has INLINE (the gather list is then ignored).
    pub inline_data: &'a [u8],
    pub imm_data: u32,
    pub invalidate_rkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub ah: Option<&'a Ah>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// RD: the local EEC the message goes through (WR-SEND-6).
    pub eecn: u32,
    /// What a Bind MW work request binds.
    pub bind: Option<MwBind<'a>>,
}

/// The window, region, range and rights of a Bind MW work request (WR-BIND-1).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    pub mw: &'a super::mw::Mw,
    /// The window's current R_Key, as the consumer knows it.
    pub rkey: u32,
    pub mr: &'a super::mr::Mr,
    pub addr: u64,
    pub length: u64,
    /// Any of REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC (WR-BIND-2).
    pub access: super::types::Access,
    /// The key byte (the R_Key's low 8 bits) the window is to carry after the bind, as a
    /// consumer that chooses its R_Keys names it (libibverbs' `ibv_inc_rkey`); None: softhca
    /// picks one. It must differ from the current one, or the bind fails; `rkey` is then not
    /// checked (binds posted back to back each name their own next key).
    pub new_key: Option<u8>,
}

impl<'a> SendWr<'a> {
    /// Bind MW: `mw` grants `access` to `[addr, addr + length)` of `mr` once this completes; its
    /// R_Key then is `mw.rkey()`.
    pub fn bind_mw(
        wr_id: u64,
        mw: &'a super::mw::Mw,
        mr: &'a super::mr::Mr,
        addr: u64,
        length: u64,
        access: super::types::Access,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            bind: Some(MwBind { mw, rkey: mw.rkey(), mr, addr, length, access, new_key: None }),
            ..Default::default()
        }
    }

    /// A Bind MW with the key byte the window's next R_Key is to carry (a consumer that
    /// chooses its R_Keys, as libibverbs' `ibv_bind_mw` does with `ibv_inc_rkey`).
    pub fn new_key(mut self, byte: u8) -> Self {
        if let Some(b) = self.bind.as_mut() {
            b.new_key = Some(byte);
        }
        self
    }

    pub fn send(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        SendWr { wr_id, opcode: WrOpcode::Send, sg_list, ..Default::default() }
    }

    pub fn send_inline(wr_id: u64, data: &'a [u8]) -> Self {
        SendWr { wr_id, opcode: WrOpcode::Send, send_flags: SendFlags::INLINE, inline_data: data, ..Default::default() }
    }

    pub fn rdma_write(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::RdmaWrite, sg_list, remote_addr, rkey, ..Default::default() }
    }

    pub fn rdma_read(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::RdmaRead, sg_list, remote_addr, rkey, ..Default::default() }
    }

    pub fn atomic_cmp_swp(wr_id: u64, sge: &'a [Sge], remote_addr: u64, rkey: u32, compare: u64, swap: u64) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::AtomicCmpSwp,
            sg_list: sge,
            remote_addr,
            rkey,
            compare_add: compare,
            swap,
            ..Default::default()
        }
    }

    pub fn atomic_fetch_add(wr_id: u64, sge: &'a [Sge], remote_addr: u64, rkey: u32, add: u64) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::AtomicFetchAdd,
            sg_list: sge,
            remote_addr,
            rkey,
            compare_add: add,
            ..Default::default()
        }
    }

    /// Turns a Send into Send with Immediate, an RDMA Write into RDMA Write with Immediate.
    pub fn imm(mut self, imm_data: u32) -> Self {
        self.opcode = match self.opcode {
            WrOpcode::Send => WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite => WrOpcode::RdmaWriteWithImm,
            other => other,
        };
        self.imm_data = imm_data;
        self
    }

    /// Addresses a UD (or RD) Send.
    pub fn ud(mut self, ah: &'a Ah, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ah = Some(ah);
        self.remote_qpn = remote_qpn;
        self.remote_qkey = remote_qkey;
        self
    }

    /// Addresses an RD message: through local EEC `eec` to QP `remote_qpn` with `remote_qkey`.
    pub fn rd(mut self, eec: &super::eec::Eec, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.eecn = eec.eecn();
        self.remote_qpn = remote_qpn;
        self.remote_qkey = remote_qkey;
        self
    }

    pub fn signaled(mut self) -> Self {
        self.send_flags |= SendFlags::SIGNALED;
        self
    }

    pub fn solicited(mut self) -> Self {
        self.send_flags |= SendFlags::SOLICITED;
        self
    }

    pub fn fence(mut self) -> Self {
        self.send_flags |= SendFlags::FENCE;
        self
    }

    pub fn inline(mut self) -> Self {
        self.send_flags |= SendFlags::INLINE;
        self
    }
}

/// A Receive Queue work request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        RecvWr { wr_id, sg_list }
    }
}

/// A queued Send WQE, owned by the QP. Slots are reused, so posting does not allocate once the
/// queue has warmed up.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub flags: SendFlags,
    /// Whether a successful completion produces a CQE (WR-COM-2, WR-COM-3).
    pub signaled: bool,
    pub sges: Vec<Sge>,
    pub inline: Vec<u8>,
    /// Message length: the gather list's (or inline data's) total, or the RDMA Read length.
    pub length: u64,
    pub imm_data: u32,
    pub invalidate_rkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub ah: Option<Ah>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub eecn: u32,
    pub bind: Option<super::mw::BindRequest>,
    /// The requester's state of this WQE.
    pub tx: crate::transport::requester::WqeTx,
}

/// A queued Receive WQE.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
    pub length: u64,
}

/// The bytes a list of SGEs covers.
pub(crate) fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| s.length as u64).sum()
}

impl RecvWr<'_> {
    /// The post-time checks of a receive, for a QP's RQ and an SRQ alike (WR-COM-7).
    pub(crate) fn check(&self, max_sge: u32) -> Result<(), super::error::VerbsError> {
        use super::error::VerbsError;
        if self.sg_list.len() > max_sge as usize {
            return Err(VerbsError::MaxSgeExceeded);
        }
        if sge_total(self.sg_list) > super::qp::MAX_MSG_SIZE {
            return Err(VerbsError::InvalidWr("scatter list longer than 2^31 bytes"));
        }
        Ok(())
    }
}

impl RecvWqe {
    /// Fills a reused slot from `wr`, keeping its SGE list's allocation.
    pub(crate) fn fill(&mut self, wr_id: u64, sges: &[Sge]) {
        self.wr_id = wr_id;
        self.sges.clear();
        self.sges.extend_from_slice(sges);
        self.length = sge_total(sges);
    }
}
