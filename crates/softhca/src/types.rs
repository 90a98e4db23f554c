//! Plain value types every layer shares (the ground floor): service types, states, access
//! rights, MTUs, GIDs, address vectors, work completions and events. Names follow libibverbs
//! (`ibv_*`) and the IBA.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

pub use crate::attr::AttrMask;
use crate::error::{Result, VerbsError};

/// QP service type (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
    Rd,
    RawIpv6,
    RawEthertype,
    /// XRC initiator (`IBV_QPT_XRC_SEND`, IBA Annex A14): RC's requester alone, each message
    /// for the XRC SRQ its work request names at the target.
    XrcSend,
    /// XRC target (`IBV_QPT_XRC_RECV`): RC's responder alone, in an XRC domain; each message
    /// takes its receive WQE, PD and CQ from the XRC SRQ its XRCETH names.
    XrcRecv,
}

impl QpType {
    /// The transport service types of the Modify QP tables, in table column order.
    pub const TABLE: [QpType; 6] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Rd, QpType::XrcSend, QpType::XrcRecv];

    pub fn is_raw(self) -> bool {
        matches!(self, QpType::RawIpv6 | QpType::RawEthertype)
    }

    /// RC and XRC: one peer QP, acknowledged and retried (XRC is RC's protocol, with each
    /// QP of a pair taking only one side of it).
    pub fn is_reliable_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// RC, UC and XRC: one peer QP, whose address and number Modify QP gives.
    pub fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc | QpType::XrcSend | QpType::XrcRecv)
    }

    pub fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }

    /// UD and Raw: every message is one packet, sent once, with nothing to acknowledge it.
    pub fn one_packet_messages(self) -> bool {
        matches!(self, QpType::Ud | QpType::RawIpv6 | QpType::RawEthertype)
    }
}

/// QP state (`ibv_qp_state`); QPS-GEN-1: exactly one at every moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    #[default]
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
}

impl QpState {
    pub const ALL: [QpState; 7] =
        [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Error];
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            QpState::Reset => "Reset",
            QpState::Init => "Init",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Error => "Error",
        };
        f.write_str(s)
    }
}

bitflags::bitflags! {
    /// Memory access rights (`ibv_access_flags`), for MRs and for a QP's inbound enables.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        const LOCAL_WRITE = 1 << 0;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        const REMOTE_ATOMIC = 1 << 3;
        const MW_BIND = 1 << 4;
    }
}

impl Access {
    /// The remote rights (rxe's `IB_ACCESS_REMOTE`): what a window may grant, and what an
    /// R_Key reaches.
    pub const REMOTE: Access = Access::REMOTE_READ.union(Access::REMOTE_WRITE).union(Access::REMOTE_ATOMIC);
}

/// Path MTU; MOD-GEN-13: only the five IBA sizes exist, wire codes 1..=5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    #[default]
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From the IBA/`ibv_mtu` code; anything but 1..=5 is `InvalidAttribute` (MOD-GEN-13).
    pub fn from_code(code: u32) -> Result<Mtu> {
        Ok(match code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return Err(VerbsError::InvalidAttribute(AttrMask::AV, "path MTU code")),
        })
    }

    /// From a size in bytes; anything but 256, 512, 1024, 2048 or 4096 is `InvalidAttribute`.
    pub fn from_bytes(bytes: u32) -> Result<Mtu> {
        match bytes {
            256 | 512 | 1024 | 2048 | 4096 => Mtu::from_code(bytes.trailing_zeros() - 7),
            _ => Err(VerbsError::InvalidAttribute(AttrMask::AV, "path MTU size")),
        }
    }
}

/// A 128-bit Global Identifier. On a RoCEv2 port it is an IPv6 address, IPv4 addresses in
/// their IPv4-mapped form (`::ffff:a.b.c.d`, PKT-ROCE-3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    pub fn from_ipv4(addr: Ipv4Addr) -> Gid {
        Gid(addr.to_ipv6_mapped().octets())
    }

    pub fn from_ipv6(addr: Ipv6Addr) -> Gid {
        Gid(addr.octets())
    }

    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn to_ipv4(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }

    /// A multicast GID: an IPv6 multicast address (`ff00::/8`, as an IB MGID) or the
    /// IPv4-mapped form of an IPv4 multicast address (`::ffff:224.0.0.0/100`), which is how a
    /// RoCEv2 port names an IPv4 group (rdma_cm's MGID for one).
    pub fn is_multicast(self) -> bool {
        self.0[0] == 0xFF || self.to_ipv4().is_some_and(|a| a.is_multicast())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// The GRH part of an address vector. Each field is optional so that an incomplete GRH can be
/// expressed and refused with `MissingAttribute` (MOD-INIT-RTR-RC-5); [`GlobalRoute::new`]
/// fills the usual defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalRoute {
    pub dgid: Option<Gid>,
    pub flow_label: Option<u32>,
    pub sgid_index: Option<u8>,
    pub hop_limit: Option<u8>,
    pub traffic_class: Option<u8>,
}

impl GlobalRoute {
    pub fn new(dgid: Gid, sgid_index: u8) -> GlobalRoute {
        GlobalRoute {
            dgid: Some(dgid),
            flow_label: Some(0),
            sgid_index: Some(sgid_index),
            hop_limit: Some(64),
            traffic_class: Some(0),
        }
    }

    pub fn is_complete(&self) -> bool {
        self.dgid.is_some()
            && self.flow_label.is_some()
            && self.sgid_index.is_some()
            && self.hop_limit.is_some()
            && self.traffic_class.is_some()
    }
}

/// Address handle attributes (`ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// The Send GRH flag. On a RoCEv2 port it must be set (PKT-ROCE-4).
    pub is_global: bool,
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub port_num: u8,
}

impl AhAttr {
    /// An address for RoCEv2: GRH set, port 1.
    pub fn roce(dgid: Gid, sgid_index: u8) -> AhAttr {
        AhAttr {
            is_global: true,
            grh: GlobalRoute::new(dgid, sgid_index),
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num: 1,
        }
    }
}

/// The Remote Node Address Vector of a connected QP (MOD "Parameters"): the address, the path
/// MTU and, optional at Init→RTR, the RC timeout and retry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    pub ah: AhAttr,
    pub path_mtu: Mtu,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
}

impl AddressVector {
    pub fn new(ah: AhAttr, path_mtu: Mtu) -> AddressVector {
        AddressVector { ah, path_mtu, timeout: None, retry_cnt: None, rnr_retry: None }
    }
}

/// Automatic Path Migration state (`ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigState {
    #[default]
    Migrated,
    Rearm,
    Armed,
}

/// A scatter/gather element: `(addr, length, lkey)` as hardware sees it (DESIGN rule 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Work completion status (`ibv_wc_status`, names of the IBA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    #[default]
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl WcStatus {
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "WR flushed error",
            WcStatus::MwBindErr => "memory window bind error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "remote aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        };
        f.write_str(s)
    }
}

/// Work completion opcode (`ibv_wc_opcode`); `Recv` is Send Data Received and `RecvRdmaWithImm`
/// is RDMA Write with Immediate Data Received (CQE-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    #[default]
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    /// An Atomic Write (`IBV_WC_ATOMIC_WRITE`).
    AtomicWrite,
    BindMw,
    LocalInv,
    /// A Fast Register work request (the kernel's `IB_WC_REG_MR`; libibverbs has none).
    FastReg,
    Recv,
    RecvRdmaWithImm,
}

bitflags::bitflags! {
    /// `ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        const GRH = 1 << 0;
        const WITH_IMM = 1 << 1;
        const WITH_INV = 1 << 3;
    }
}

/// The special QPs of a port (IBA 10.2.5, Get Special QP): QP0 (the Subnet Management
/// Interface) and QP1 (the General Services Interface, which carries the management
/// datagrams of the connection manager). A RoCE port has no subnet manager and so no QP0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecialQp {
    Smi,
    Gsi,
}

/// The GSI's QP number and its well-known Q_Key (IBA 13.5.1).
pub const GSI_QPN: u32 = 1;
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The type of a memory window (`ibv_mw_type`, IBA 10.6.7). A type 1 window is bound by any QP
/// of its PD and rebound at will; a type 2 window (type 2B in the IBA) is bound by a Bind MW
/// work request to the QP that posted it, which alone may use its R_Key, and must be
/// invalidated (Local Invalidate, or a Send with Invalidate from the peer) before it is bound
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MwType {
    #[default]
    Type1,
    Type2,
}

/// The network header of a received packet (the kernel's `rdma_network_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkHdrType {
    /// None that a CQE reports: not a UD receive.
    #[default]
    Ib,
    Ipv4,
    Ipv6,
}

/// A work completion (`ibv_wc`). Fields other than `wr_id`, `status` and `qp_num` are defined
/// only when `status` is Success (CQE-16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (host order) when `wc_flags` has WITH_IMM, the invalidated R_Key with
    /// WITH_INV.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: WcFlags,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    /// The network header a UD receive arrived with, which decides the layout of its GRH area
    /// (PKT-ROCE-11); the kernel's `ib_wc.network_hdr_type`. `Ib` on other CQEs.
    pub network_hdr_type: NetworkHdrType,
    /// RD: the local EEC the message arrived on (CQE-11).
    pub eecn: u32,
    /// RD receive CQEs: the RQ slots freed since the QP's previous receive CQE, whatever the
    /// status. A WQE's slot frees when a channel binds it (ORD-RD-1), so a CQE that completes
    /// out of post order may report 0 and a later one 2 (CQE-15).
    pub freed: u32,
}

impl Wc {
    /// `Ok(self)` for a successful completion, the status as an error otherwise.
    pub fn ok(&self) -> std::result::Result<&Wc, WcStatus> {
        if self.status.is_ok() {
            Ok(self)
        } else {
            Err(self.status)
        }
    }

    pub fn imm(&self) -> Option<u32> {
        self.wc_flags.contains(WcFlags::WITH_IMM).then_some(self.imm_data)
    }
}

/// An affiliated or unaffiliated asynchronous event type (`ibv_event_type`, EVT-AE-1/3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventType {
    CqErr,
    QpFatal,
    QpReqErr,
    QpAccessErr,
    CommEst,
    SqDrained,
    PathMig,
    PathMigErr,
    QpLastWqeReached,
    SrqErr,
    SrqLimitReached,
    PortActive,
    PortErr,
    DeviceFatal,
}

/// The object an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP, by QPN.
    Qp(u32),
    /// A CQ, by handle.
    Cq(u32),
    /// An SRQ, by handle.
    Srq(u32),
    Port(u8),
    Device,
}

/// An asynchronous event (`ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    pub event_type: AsyncEventType,
    pub element: EventElement,
}

/// Which completion the next notification waits for (`ibv_req_notify_cq`'s `solicited_only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotifyKind {
    NextCompletion,
    Solicited,
}
