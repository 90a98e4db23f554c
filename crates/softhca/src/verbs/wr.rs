//! Work requests as the consumer posts them (`ibv_send_wr`, `ibv_recv_wr`) and the table of
//! which SQ operations each service type accepts (WR-SQ).

use super::ah::Ah;
use super::types::Sge;
use crate::transport::qp::QpCap;
use crate::transport::wqe::{sge_total, RecvWqe, SendWqe};
pub use crate::transport::wqe::{wr_allowed, SendFlags, WrOpcode};

/// Largest message: 2^31 bytes (WR-WRITE-4).
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Readies an SQ slot so that filling it from a WR never allocates: room for the most SGEs
/// and inline bytes a WR may carry.
pub(crate) fn prepare_send(cap: &QpCap) -> impl FnMut(&mut SendWqe) {
    let (sges, inline) = (cap.max_send_sge.max(1) as usize, cap.max_inline_data as usize);
    move |w| {
        w.sges.reserve(sges);
        w.inline.reserve(inline);
    }
}

/// Readies an RQ (or SRQ) slot for `max_sge` SGEs.
pub(crate) fn prepare_recv(max_sge: u32) -> impl FnMut(&mut RecvWqe) {
    let sges = max_sge.max(1) as usize;
    move |w| w.sges.reserve(sges)
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
    /// XRC: the SRQ at the target QP the message is for (`wr.qp_type.xrc.remote_srqn`,
    /// `ibv_wr_set_xrc_srqn`), carried in every request packet's XRCETH.
    pub xrc_srqn: u32,
    /// RD: the local EEC the message goes through (WR-SEND-6).
    pub eecn: u32,
    /// What a Bind MW work request binds.
    pub bind: Option<MwBind<'a>>,
    /// A Raw Send's datagram fields (WR-SEND-7, WR-SEND-8); `None` on other service types.
    pub raw: Option<RawFields>,
    /// What a Fast Register work request registers.
    pub fast_reg: Option<FastRegWr<'a>>,
}

/// The region, key byte and rights of a Fast Register work request (see
/// [`super::pd::Pd::alloc_fast_reg_mr`]).
#[derive(Debug, Clone, Copy)]
pub struct FastRegWr<'a> {
    pub mr: &'a super::mr::Mr,
    /// The key byte (the keys' low 8 bits) the region's L_Key and R_Key get: it must differ
    /// from the current one.
    pub new_key: u8,
    pub access: super::types::Access,
}

/// The fields a Raw datagram Send carries beside its message (IBA 10.8.3.2). On a RoCE port
/// the message of a Raw Ethertype QP is a whole Ethernet frame (destination MAC on, as
/// libibverbs' Raw Packet QP sends it) and a Raw IPv6 QP's an IPv6 datagram (its header on):
/// there is no LRH, so `dlid`, `sl` and `src_path_bits` are accepted and go nowhere, as an
/// address vector's do (MOD-AV-1); an `ethertype` is written into the frame's EtherType
/// field, the RWH's place on Ethernet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawFields {
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub ethertype: Option<u16>,
}

/// The window, region, range and rights of a Bind MW work request (WR-BIND-1).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    pub mw: &'a super::mw::Mw,
    /// The window's current R_Key, as the consumer knows it.
    pub rkey: u32,
    /// The region's L_Key (Reregister Memory Region keeps it).
    pub mr_key: u32,
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
        mr: &super::mr::Mr,
        addr: u64,
        length: u64,
        access: super::types::Access,
    ) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            bind: Some(MwBind { mw, rkey: mw.rkey(), mr_key: mr.lkey(), addr, length, access, new_key: None }),
            ..Default::default()
        }
    }

    /// Unbinds type 1 window `mw` (a Bind MW of length zero, IBA 10.6.7): it gets a new R_Key
    /// and reaches no region any more, which can then be deregistered.
    pub fn unbind_mw(wr_id: u64, mw: &'a super::mw::Mw) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            bind: Some(MwBind {
                mw,
                rkey: mw.rkey(),
                mr_key: 0,
                addr: 0,
                length: 0,
                access: super::types::Access::empty(),
                new_key: None,
            }),
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

    /// Fast Register: `mr`, a fast-registration region in the Free state, becomes Valid with
    /// `access`, its keys carrying `new_key` (read them from `mr` once this completes). Runs
    /// in order on the SQ, like a bind.
    pub fn fast_reg(wr_id: u64, mr: &'a super::mr::Mr, access: super::types::Access, new_key: u8) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::FastReg,
            fast_reg: Some(FastRegWr { mr, new_key, access }),
            ..Default::default()
        }
    }

    pub fn send(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        SendWr { wr_id, opcode: WrOpcode::Send, sg_list, ..Default::default() }
    }

    /// A Send with Invalidate (RC): the responder invalidates `rkey` (a type 2 window bound to
    /// its QP) before the receive completes, and says so in the CQE.
    pub fn send_with_inv(wr_id: u64, sg_list: &'a [Sge], rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::SendWithInv, sg_list, invalidate_rkey: rkey, ..Default::default() }
    }

    /// A Local Invalidate of `rkey`: a type 2 window bound to this QP becomes free to bind.
    pub fn local_inv(wr_id: u64, rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::LocalInv, invalidate_rkey: rkey, ..Default::default() }
    }

    /// A Raw datagram Send (Raw Ethertype or Raw IPv6 QP) with its datagram fields.
    pub fn raw(mut self, fields: RawFields) -> Self {
        self.raw = Some(fields);
        self
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

    /// An Atomic Write (RC): the 8 bytes `sg_list` gathers (or inline data, with
    /// [`SendFlags::INLINE`]) stored at `remote_addr`, an aligned word of a region of `rkey`
    /// with Remote Write, in one atomic store.
    pub fn atomic_write(wr_id: u64, sg_list: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        SendWr { wr_id, opcode: WrOpcode::AtomicWrite, sg_list, remote_addr, rkey, ..Default::default() }
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

    /// Addresses an XRC message to the target's SRQ number `srqn` ([`super::srq::Srq::srq_num`]).
    pub fn xrc(mut self, srqn: u32) -> Self {
        self.xrc_srqn = srqn;
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

impl RecvWr<'_> {
    /// The post-time checks of a receive, for a QP's RQ and an SRQ alike (WR-COM-7).
    pub(crate) fn check(&self, max_sge: u32) -> Result<(), super::error::VerbsError> {
        use super::error::VerbsError;
        if self.sg_list.len() > max_sge as usize {
            return Err(VerbsError::MaxSgeExceeded);
        }
        if sge_total(self.sg_list) > MAX_MSG_SIZE {
            return Err(VerbsError::InvalidWr("scatter list longer than 2^31 bytes"));
        }
        Ok(())
    }
}
