//! The communication manager's state machine (IBA 12.9), sans-IO like the rest of the
//! transport: MADs in with `now`, MADs out, deadlines, and events for the consumer. It knows
//! nothing of QPs or sockets: the consumer moves its QP through the states the events call for
//! (a REP is the requester's cue for RTR and RTS, a REQ the responder's for RTR), and the
//! driver carries the MADs to and from the GSI (QP1).
//!
//! What it does: REQ / REP / RTU to connect, REJ with its reasons (Table 109), MRA to ask for
//! more time, DREQ / DREP to disconnect; every message that wants an answer is sent again after
//! the CM response timeout the peer asked for, up to the Max CM Retries of the REQ, then the
//! connection fails with REJ Timeout (4), whose ARI is this side's CA GUID (Linux's CM finds
//! the connection by it). Duplicates are answered, never taken twice: a REQ again gets the
//! REP again (or, while the consumer decides, an MRA), a REP again the RTU again, a DREQ
//! again the DREP again once the DREP went. As Linux's CM, a DREQ is answered when the
//! consumer disconnects (or destroys) in turn, not before, and a connection's time wait ends
//! in an event of its own (TIMEWAIT_EXIT). A REQ from a QP already connected here is refused
//! as stale (REJ 10).
//!
//! What it takes: a MAD of the CM class (0x07), base version 1, class version 2, method Send,
//! with an attribute it defines; and then only a message that names one of its connections by
//! both communication IDs, comes from that connection's peer and fits the connection's state
//! (as Linux's `cm_acquire_id` matches both IDs). Everything else is dropped and counted
//! ([`Cm::counters`]); nothing a peer sends makes it panic. Its memory is bounded too: at most
//! [`Cm::max_pending`] REQs wait for the consumer's answer (beyond that a REQ is rejected with
//! No Resources), every other state but Established ends by a deadline.
//!
//! `verbs::CmAgent` runs it on a device's QP1; SIDR (IBA 12.11) for UD services too, and
//! softhca-ibverbs' `rdmacm` is rdma_cm on top of it. Not yet: LAP/APR (path migration).

use std::collections::{BTreeMap, VecDeque};

use crate::wire::mad::{
    CmDrep, CmDreq, CmMessage, CmMra, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, CmSidrReq, MadHeaderRepr,
    CM_CLASS_VERSION, MAD_LEN, METHOD_SEND,
};

/// REJ reasons of IBA Table 109 that this machine gives.
pub mod reason {
    pub const NO_QP: u16 = 1;
    /// No Resources Available: what this CM answers a REQ with when
    /// [`super::Cm::max_pending`] REQs already wait for the consumer.
    pub const NO_RESOURCES: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale Connection: the REQ names a QP that is in a connection with this CM already.
    pub const STALE_CONNECTION: u16 = 10;
    pub const CONSUMER_REJECT: u16 = 28;
}

/// REJ Message REJected values (IBA Table 108).
mod rejected {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
}

/// MRA Message MRAed values (IBA Table 107).
mod mraed {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
}

/// A connection, by its local communication ID.
pub type CommId = u32;

/// The peer's GSI: its GID (RoCE addresses GSIs by GID).
pub type Peer = [u8; 16];

/// Why [`Cm::notify_established`] changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEstablished {
    /// The connection is Established already (Linux: EISCONN).
    Already,
    /// It is not a responder's connection waiting for its RTU (Linux: EINVAL).
    WrongState,
}

/// What the consumer learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened service: accept or reject it.
    ConnectRequest { id: CommId, peer: Peer, req: Box<CmReq> },
    /// Connected: the requester got the REP (and sent the RTU), or the responder the RTU.
    Established { id: CommId, remote_qpn: u32, remote_psn: u32 },
    /// The peer rejected (or a retry count ran out: reason 4 Timeout, no private data). Also
    /// ends a connection already Established on this side when the peer rejects it after all
    /// (a responder that gave up waiting for the RTU sends REJ Timeout), as Linux's CM reports
    /// such a REJ (`IB_CM_REJ_RECEIVED`).
    Rejected { id: CommId, reason: u16, private_data: Vec<u8> },
    /// A DREQ / DREP exchange ended the connection (or its retries ran out). A responder whose
    /// REP was not yet answered by an RTU can get this without Established before it: the
    /// requester disconnected while the RTU was lost. The side that received the DREQ gets
    /// this at once and answers with its DREP when the consumer calls [`Cm::disconnect`] (or
    /// [`Cm::destroy`]), as Linux's CM leaves the DREP to `rdma_disconnect`. `timed_out`: this
    /// side's DREQ went unanswered through its retries (Linux's `IB_CM_DREQ_ERROR`, which
    /// rdma_cm reports as DISCONNECTED with -ETIMEDOUT).
    Disconnected { id: CommId, timed_out: bool },
    /// The connection's time wait is over (after a disconnection, or a REJ of an established
    /// connection): Linux's `RDMA_CM_EVENT_TIMEWAIT_EXIT`, the QP free for another.
    TimewaitExit { id: CommId },
    /// A SIDR REQ for a listened service (UD service resolution): answer it with
    /// [`Cm::sidr_reply`].
    SidrRequest { id: CommId, peer: Peer, req: Box<CmSidrReq> },
    /// The SIDR REP that answered this side's SIDR REQ (its status says whether the service
    /// was found). A SIDR REQ left unanswered after its retries ends in `Rejected` (Timeout).
    SidrReply { id: CommId, rep: Box<CmSidrRep> },
}

/// The parameters a consumer gives a connection request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    pub service_id: u64,
    pub local_qpn: u32,
    pub starting_psn: u32,
    /// The CM Response Timeout (4.096 µs × 2^t) this side wants the peer to wait for it.
    pub response_timeout: u8,
    pub max_cm_retries: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub local_gid: Peer,
}

/// What a [`Cm`] dropped, answered again, rejected and gave up, since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs dropped unread: too short, another management class, base version, class version
    /// or method than the CM's (0x07, 1, 2, Send), or an attribute it does not take.
    pub malformed: u64,
    /// CM messages dropped: naming no connection of this CM (unknown communication IDs),
    /// another peer's, or not taken in the connection's state (SIDR included).
    pub unmatched: u64,
    /// Repeated messages recognised (REQ, REP, RTU, DREQ, DREP, MRA in TimeWait): answered
    /// again where the protocol says so, never taken twice.
    pub duplicates: u64,
    /// REQs rejected with Invalid Service ID: nobody listens to their service.
    pub rejected_no_listener: u64,
    /// REQs for a reserved service that came before its listen and were held for it
    /// ([`Cm::reserve`]).
    pub held_for_listen: u64,
    /// REQs rejected with No Resources: [`Cm::max_pending`] REQs already waited for the
    /// consumer.
    pub rejected_backlog: u64,
    /// REQs rejected with Stale Connection: their QP is in a connection here already.
    pub rejected_stale: u64,
    /// Messages sent again at their deadline.
    pub resent: u64,
    /// Connections given up when Max CM Retries ran out.
    pub timeouts: u64,
}

impl CmCounters {
    /// All MADs dropped without an effect.
    pub fn dropped(&self) -> u64 {
        self.malformed + self.unmatched
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Requester: REQ sent, waiting for REP (or REJ, MRA).
    ReqSent,
    /// Responder: REQ received, the consumer has not answered yet.
    ReqRcvd,
    /// Responder: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    /// The peer's DREQ came; the DREP waits for the consumer's disconnect (or destroy).
    DreqRcvd,
    /// Disconnected; kept a while to answer a repeated DREQ.
    TimeWait,
}

struct Conn {
    state: State,
    /// This side sent the REQ.
    requester: bool,
    peer: Peer,
    /// The peer's communication ID; 0 while a requester does not know it yet.
    remote_comm_id: u32,
    tid: u64,
    /// The last message that wants an answer (or that answers a repeated request).
    last: Box<[u8; MAD_LEN]>,
    retries_left: u8,
    /// How long the peer said to wait for it before sending again, in ns.
    wait_ns: u64,
    deadline: Option<u64>,
    /// This side's QP (from the REQ or REP it sent): a DREQ names it.
    local_qpn: u32,
    remote_qpn: u32,
    remote_psn: u32,
    /// The REQ's Max CM Retries, for every message of the connection.
    max_retries: u8,
    /// Requester: the REP that answered (its private data and resources are the consumer's).
    rep: Option<Box<CmRep>>,
    /// Requester: the RTU waits for [`Cm::establish`] (made with [`Cm::request_held`]).
    hold_rtu: bool,
    /// The Local CA GUID of the REQ or REP this side sent: a REJ Timeout carries it as its
    /// ARI, by which the peer finds the connection (see [`Cm::handle_timeout`]).
    local_ca_guid: u64,
    /// An XRC connection (the REQ's Transport Service Type 3, Extended Transport Type 1): its
    /// REP names the target QP in the Local EE Context Number, not the Local QPN (see [`xrc`]).
    xrc: bool,
}

/// XRC's REQ and REP (IBA Annex A14; Linux's `cm_format_rep` and `cm_rep_get_qpn`): an XRC
/// target's REP carries its QPN in the Local EE Context Number, its Local QPN 0 and its SRQ
/// bit set (the target takes its receives from SRQs).
mod xrc {
    use super::{CmRep, CmReq};

    pub(super) fn is(req: &CmReq) -> bool {
        req.transport_service_type == 3 && req.extended_transport_type == 1
    }

    /// The REP a target sends for `rep`, whose Local QPN is its QP's.
    pub(super) fn rep(mut rep: CmRep) -> CmRep {
        (rep.local_eecn, rep.local_qpn, rep.srq) = (rep.local_qpn, 0, 1);
        rep
    }

    /// The target's QPN in a REP an initiator got.
    pub(super) fn qpn(rep: &CmRep) -> u32 {
        rep.local_eecn
    }
}

impl Conn {
    /// Enters the time wait, which ends at `until` (then TIMEWAIT_EXIT, IBA 12.9.8.7).
    fn enter_time_wait(&mut self, until: u64) {
        self.state = State::TimeWait;
        self.deadline = Some(until);
    }
}

/// A SIDR exchange (IBA 12.11): a requester's SIDR REQ waiting for its REP, or a responder's
/// request kept (until its deadline) to answer a repeated REQ with the same REP.
struct Sidr {
    requester: bool,
    peer: Peer,
    /// Responder: the requester's Request ID.
    remote_id: u32,
    tid: u64,
    /// The REQ (requester) or the REP once answered (responder).
    last: Option<Box<[u8; MAD_LEN]>>,
    retries_left: u8,
    wait_ns: u64,
    deadline: u64,
}

/// SIDR REP statuses (IBA Table 121).
pub mod sidr_status {
    pub const SUCCESS: u8 = 0;
    /// No such service: nobody listens to the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The consumer refused.
    pub const REJECT: u8 = 2;
    /// No QP (here: too many requests waiting).
    pub const NO_QP: u8 = 3;
}

/// The service timeout of the MRA this CM sends for a REQ its consumer has not answered yet:
/// Linux's rdma_cm's (`CMA_CM_MRA_SETTING`, 4.096 us x 2^24, about 69 s).
pub const MRA_SERVICE_TIMEOUT: u8 = 24;

/// How many REQs may wait for the consumer's answer at once, unless told otherwise.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// How long a REQ for a reserved service nobody listens to yet waits for the listen
/// ([`Cm::reserve`]) before it is rejected as Linux rejects it at once; and how many wait.
pub const REQ_HOLD_NS: u64 = 1_000_000_000;
pub const MAX_HELD_REQS: usize = 64;

/// A REQ waiting for its service's listen.
struct HeldReq {
    service_id: u64,
    peer: Peer,
    tid: u64,
    req: Box<CmReq>,
    /// When it came; it waits until [`REQ_HOLD_NS`] later.
    came: u64,
}

impl HeldReq {
    fn until(&self) -> u64 {
        self.came.saturating_add(REQ_HOLD_NS)
    }
}

/// One port's connection manager.
pub struct Cm {
    conns: BTreeMap<CommId, Conn>,
    /// Responder connections by (peer, peer's comm ID): to recognise a repeated REQ.
    by_remote: BTreeMap<(Peer, u32), CommId>,
    listening: BTreeMap<u64, ()>,
    /// Services an id has bound (its port taken) that may listen soon; see [`Cm::reserve`].
    reserved: BTreeMap<u64, ()>,
    held: VecDeque<HeldReq>,
    out: VecDeque<(Peer, Box<[u8; MAD_LEN]>)>,
    events: VecDeque<CmEvent>,
    next_id: u32,
    next_tid: u64,
    /// How long a disconnected connection stays to answer repeated DREQs.
    time_wait_ns: u64,
    /// Connections in ReqRcvd, and how many there may be.
    pending: usize,
    max_pending: usize,
    counters: CmCounters,
    sidrs: BTreeMap<CommId, Sidr>,
    /// Responder SIDR requests by (peer, Request ID): to recognise a repeated SIDR REQ.
    sidr_by_remote: BTreeMap<(Peer, u32), CommId>,
}

/// The DREP that answers the peer's DREQ for connection `id`.
fn drep_for(id: CommId, conn: &Conn) -> CmDrep {
    CmDrep { local_comm_id: id, remote_comm_id: conn.remote_comm_id, ..Default::default() }
}

/// A REJ Timeout's Additional Rejection Information: the rejecting side's CA GUID, the one
/// its REQ or REP carried (IBA Table 109; Linux's CM sends its node GUID). Linux's
/// `cm_acquire_rejected_id` finds the connection a REJ Timeout ends by this GUID and the REJ's
/// Local Communication ID (`cm_find_remote_id`): without it the REJ is dropped, and the peer
/// waits out its own retries instead.
fn set_timeout_ari(rej: &mut CmRej, ca_guid: u64) {
    rej.rejected_info_length = 8;
    rej.ari[..8].copy_from_slice(&ca_guid.to_be_bytes());
}

/// 4.096 µs × 2^t in ns (IBA 12.7.22), t at most 31.
pub fn cm_timeout_ns(t: u8) -> u64 {
    4096u64 << t.min(31)
}

impl Cm {
    /// `seed` makes the communication IDs (and transaction IDs) differ per port and per run.
    pub fn new(seed: u32) -> Cm {
        Cm {
            conns: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            listening: BTreeMap::new(),
            reserved: BTreeMap::new(),
            held: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_id: seed | 1,
            next_tid: u64::from(seed) << 32,
            time_wait_ns: 1_000_000_000,
            pending: 0,
            max_pending: DEFAULT_MAX_PENDING,
            counters: CmCounters::default(),
            sidrs: BTreeMap::new(),
            sidr_by_remote: BTreeMap::new(),
        }
    }

    /// Listens to `service_id`: REQs for it start connections, those held for it first.
    pub fn listen(&mut self, service_id: u64) {
        self.listening.insert(service_id, ());
        for h in self.take_held(service_id) {
            self.on_req(h.came, h.peer, h.tid, h.req);
        }
    }

    /// Marks `service_id` as bound by a consumer that has not listened yet. A REQ for it that
    /// comes before the listen waits for it up to [`REQ_HOLD_NS`] (then it is rejected with
    /// Invalid Service ID, as Linux's CM rejects it at once): a server that hands its port to
    /// its client before it listens (qperf 0.4.11's `-cm1` tests) races that client's REQ,
    /// which a user-space CM in the same machine's other process wins far more often than
    /// the kernel's does.
    pub fn reserve(&mut self, service_id: u64) {
        self.reserved.insert(service_id, ());
    }

    /// Ends [`Cm::reserve`]: the REQs still held for `service_id` are rejected now.
    pub fn unreserve(&mut self, service_id: u64) {
        self.reserved.remove(&service_id);
        for h in self.take_held(service_id) {
            self.refuse_req(h.peer, h.tid, &h.req, reason::INVALID_SERVICE_ID);
        }
    }

    /// The REQs held for `service_id`, in the order they came, out of the queue.
    fn take_held(&mut self, service_id: u64) -> Vec<HeldReq> {
        let mut mine = Vec::new();
        for h in std::mem::take(&mut self.held) {
            if h.service_id == service_id {
                mine.push(h);
            } else {
                self.held.push_back(h);
            }
        }
        mine
    }

    /// Stops listening: later REQs for `service_id` are rejected (Invalid Service ID);
    /// requests already taken stay.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.remove(&service_id);
    }

    /// How many REQs may wait for the consumer (in ReqRcvd: a ConnectRequest not yet accepted
    /// or rejected) before further REQs are rejected with No Resources (3).
    ///
    /// Linux's IB CM has no such bound (rdma_cm's listen backlog is not enforced for IB): a
    /// REQ flood there costs a `cm_id` each until the consumer answers. Here every other state
    /// ends by a deadline, so this bound is what keeps a flood of REQs, each with a new
    /// communication ID, from growing the CM without bound. No Resources is the Table 109 reason
    /// that says what happened and that a later REQ may succeed (Linux's requester reports it
    /// as it does any REJ); repeats of REQs already waiting are recognised, never counted twice.
    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    pub fn set_max_pending(&mut self, max: usize) {
        self.max_pending = max;
    }

    /// How long a disconnected connection stays (to answer a repeated DREQ with its DREP).
    pub fn set_time_wait_ns(&mut self, ns: u64) {
        self.time_wait_ns = ns;
    }

    /// What this CM dropped, answered again, rejected and gave up.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// Connections this CM holds, in any state (TimeWait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// REQs waiting for the consumer's answer.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Responder connections indexed by the peer's GID and communication ID (how a repeated
    /// REQ is recognised): never more than [`Cm::connections`], each entry leaves with its
    /// connection.
    pub fn remote_ids(&self) -> usize {
        self.by_remote.len()
    }

    /// Starts a connection to `peer` with the REQ a minimal consumer sends (RC, MTU 4096,
    /// retry counts 7): see [`Cm::request`] for one the consumer fills in.
    pub fn connect(&mut self, now: u64, peer: Peer, p: &ConnectParams) -> CommId {
        let req = CmReq {
            service_id: p.service_id,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: p.response_timeout,
            local_cm_response_timeout: p.response_timeout,
            max_cm_retries: p.max_cm_retries,
            retry_count: 7,
            rnr_retry_count: 7,
            partition_key: 0xFFFF,
            path_mtu: 5,
            primary_local_lid: 0xFFFF,
            primary_remote_lid: 0xFFFF,
            primary_local_gid: p.local_gid,
            primary_remote_gid: peer,
            primary_hop_limit: 64,
            ..Default::default()
        };
        self.request(now, peer, req)
    }

    /// Sends `req` (its Local Communication ID is chosen here) and waits for the answer for
    /// its Remote CM Response Timeout, sending it again up to its Max CM Retries.
    pub fn request(&mut self, now: u64, peer: Peer, mut req: CmReq) -> CommId {
        let id = self.fresh_id();
        let tid = self.fresh_tid();
        req.local_comm_id = id;
        let mut conn = Conn {
            state: State::ReqSent,
            requester: true,
            peer,
            remote_comm_id: 0,
            tid,
            last: Box::new([0; MAD_LEN]),
            retries_left: req.max_cm_retries,
            wait_ns: cm_timeout_ns(req.remote_cm_response_timeout),
            deadline: None,
            local_qpn: req.local_qpn,
            remote_qpn: 0,
            remote_psn: 0,
            max_retries: req.max_cm_retries,
            rep: None,
            hold_rtu: false,
            local_ca_guid: req.local_ca_guid,
            xrc: xrc::is(&req),
        };
        self.send_waiting(now, &mut conn, CmMessage::Req(Box::new(req)));
        self.put(id, conn);
        id
    }

    /// As [`Cm::request`], but the RTU answering the REP waits for [`Cm::establish`]: the
    /// consumer readies its QP first (librdmacm moves the QP to RTR and RTS, then tells the
    /// kernel's CM to send the RTU), so the responder sends nothing before the requester can
    /// take it. A repeated REP meanwhile is not answered.
    pub fn request_held(&mut self, now: u64, peer: Peer, req: CmReq) -> CommId {
        let id = self.request(now, peer, req);
        if let Some(c) = self.conns.get_mut(&id) {
            c.hold_rtu = true;
        }
        id
    }

    /// Sends the RTU a [`Cm::request_held`] connection holds since its REP.
    pub fn establish(&mut self, id: CommId) -> bool {
        let Some(c) = self.conns.get_mut(&id) else { return false };
        if !(c.requester && c.hold_rtu && c.state == State::Established && c.rep.is_some()) {
            return false;
        }
        c.hold_rtu = false;
        let (peer, mad) = (c.peer, c.last.clone());
        self.out.push_back((peer, mad));
        true
    }

    /// The consumer saw the connection carry traffic before the RTU came (a Communication
    /// Established event on its QP): a responder's connection whose REP went out is
    /// Established now, as if the RTU had come (Linux's `cm_establish`, for `rdma_notify`).
    pub fn notify_established(&mut self, id: CommId) -> Result<(), NotEstablished> {
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::RepSent) => {
                self.establish_responder(id);
                Ok(())
            }
            Some(State::Established) => Err(NotEstablished::Already),
            _ => Err(NotEstablished::WrongState),
        }
    }

    /// A responder's connection whose REP went out becomes Established (its RTU came, or the
    /// consumer saw traffic first), with its event.
    fn establish_responder(&mut self, id: CommId) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        conn.state = State::Established;
        conn.deadline = None;
        let (remote_qpn, remote_psn) = (conn.remote_qpn, conn.remote_psn);
        self.events.push_back(CmEvent::Established { id, remote_qpn, remote_psn });
    }

    /// Whether connection `id` is Established (an `rdma_notify` of a path migration needs it).
    pub fn is_established(&self, id: CommId) -> bool {
        self.conns.get(&id).is_some_and(|c| c.state == State::Established)
    }

    /// The REP that answered the REQ of requester connection `id`, its Local QPN the
    /// responder's QP's wherever the REP carried it (an XRC target's is in its Local EECN).
    pub fn reply(&self, id: CommId) -> Option<&CmRep> {
        self.conns.get(&id)?.rep.as_deref()
    }

    /// Accepts a REQ with the REP a minimal consumer sends.
    pub fn accept(&mut self, now: u64, id: CommId, local_qpn: u32, starting_psn: u32) -> bool {
        self.reply_with(now, id, CmRep { local_qpn, starting_psn, rnr_retry_count: 7, ..Default::default() })
    }

    /// Accepts a REQ: sends `rep` (its communication IDs filled in here) and waits for the RTU.
    pub fn reply_with(&mut self, now: u64, id: CommId, mut rep: CmRep) -> bool {
        if self.conns.get(&id).map(|c| c.state) != Some(State::ReqRcvd) {
            return false;
        }
        let Some(mut conn) = self.take(id) else { return false };
        rep.local_comm_id = id;
        rep.remote_comm_id = conn.remote_comm_id;
        conn.state = State::RepSent;
        conn.local_qpn = rep.local_qpn;
        if conn.xrc {
            rep = xrc::rep(rep);
        }
        conn.local_ca_guid = rep.local_ca_guid;
        conn.retries_left = conn.max_retries;
        self.send_waiting(now, &mut conn, CmMessage::Rep(Box::new(rep)));
        self.put(id, conn);
        true
    }

    /// Rejects a REQ (reason 28, Consumer Reject, unless told otherwise).
    pub fn reject(&mut self, id: CommId, reason: u16) -> bool {
        self.reject_with(id, reason, &[])
    }

    /// Rejects a REQ (or a REP, as a requester) with `private_data` (at most 148 bytes kept).
    /// Message REJected says which, as Linux's `cm_format_rej` sets it: REQ (0) for a REQ
    /// the consumer has not answered, REP (1) for a requester's connection the REP made, and
    /// Other (2) for the rest (a REQ or REP of this side's own still unanswered).
    pub fn reject_with(&mut self, id: CommId, reason: u16, private_data: &[u8]) -> bool {
        let Some(conn) = self.take(id) else { return false };
        self.unlink(id, &conn);
        let message_rejected = match conn.state {
            State::ReqRcvd => rejected::REQ,
            State::Established if conn.requester => rejected::REP,
            _ => rejected::OTHER,
        };
        let mut rej = CmRej {
            local_comm_id: id,
            remote_comm_id: conn.remote_comm_id,
            message_rejected,
            reason,
            ..Default::default()
        };
        if reason == reason::TIMEOUT {
            set_timeout_ari(&mut rej, conn.local_ca_guid);
        }
        let n = private_data.len().min(rej.private_data.len());
        rej.private_data[..n].copy_from_slice(&private_data[..n]);
        self.send_once(conn.peer, conn.tid, CmMessage::Rej(Box::new(rej)));
        true
    }

    /// Forgets connection `id` as the consumer destroys it, telling the peer as Linux's CM
    /// does: a REQ or REP still unanswered is rejected (Timeout for the requester, Consumer
    /// Reject for the responder), an established connection gets a DREQ, sent once.
    pub fn destroy(&mut self, id: CommId) {
        self.forget_sidr(id);
        let Some(conn) = self.conns.get(&id) else { return };
        match conn.state {
            State::ReqSent => {
                self.reject(id, reason::TIMEOUT);
            }
            State::ReqRcvd | State::RepSent => {
                self.reject(id, reason::CONSUMER_REJECT);
            }
            State::Established => {
                let dreq = CmDreq {
                    local_comm_id: id,
                    remote_comm_id: conn.remote_comm_id,
                    remote_qpn_eecn: conn.remote_qpn,
                    ..Default::default()
                };
                let (peer, tid) = (conn.peer, self.fresh_tid());
                self.send_once(peer, tid, CmMessage::Dreq(Box::new(dreq)));
                self.forget(id);
            }
            State::DreqRcvd => {
                let (peer, tid, drep) = (conn.peer, conn.tid, drep_for(id, conn));
                self.send_once(peer, tid, CmMessage::Drep(Box::new(drep)));
                self.forget(id);
            }
            State::DreqSent | State::TimeWait => self.forget(id),
        }
    }

    fn forget(&mut self, id: CommId) {
        if let Some(conn) = self.take(id) {
            self.unlink(id, &conn);
        }
    }

    /// Disconnects: sends the DREQ of an established connection, or the DREP that answers the
    /// peer's DREQ (the connection then waits out its time wait). False when there is neither.
    pub fn disconnect(&mut self, now: u64, id: CommId) -> bool {
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::Established) => {}
            Some(State::DreqRcvd) => {
                let Some(conn) = self.conns.get_mut(&id) else { return false };
                conn.enter_time_wait(now + self.time_wait_ns);
                let (peer, tid, drep) = (conn.peer, conn.tid, drep_for(id, conn));
                self.send_once(peer, tid, CmMessage::Drep(Box::new(drep)));
                return true;
            }
            _ => return false,
        }
        let Some(mut conn) = self.take(id) else { return false };
        let dreq = CmDreq {
            local_comm_id: id,
            remote_comm_id: conn.remote_comm_id,
            remote_qpn_eecn: conn.remote_qpn,
            ..Default::default()
        };
        conn.state = State::DreqSent;
        conn.retries_left = conn.max_retries;
        conn.tid = self.fresh_tid();
        self.send_waiting(now, &mut conn, CmMessage::Dreq(Box::new(dreq)));
        self.put(id, conn);
        true
    }

    /// One MAD received from `peer`'s GSI. Anything that does not parse, or names no
    /// connection, is dropped and counted (a REQ for a service nobody listens to is rejected,
    /// a DREQ for no connection answered with a DREP, as Linux's CM does).
    pub fn handle_mad(&mut self, now: u64, peer: Peer, mad: &[u8]) {
        let Ok((h, m)) = CmMessage::parse(mad) else {
            self.counters.malformed += 1;
            return;
        };
        if h.base_version != 1 || h.class_version != CM_CLASS_VERSION || h.method != METHOD_SEND {
            self.counters.malformed += 1;
            return;
        }
        let taken = match m {
            CmMessage::Req(req) => self.on_req(now, peer, h.transaction_id, req),
            CmMessage::Rep(rep) => self.on_rep(peer, &rep),
            CmMessage::Rtu(rtu) => self.on_rtu(peer, &rtu),
            CmMessage::Rej(rej) => self.on_rej(now, peer, &rej),
            CmMessage::Mra(mra) => self.on_mra(now, peer, &mra),
            CmMessage::Dreq(dreq) => self.on_dreq(peer, h.transaction_id, &dreq),
            CmMessage::Drep(drep) => self.on_drep(now, peer, &drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(now, peer, h.transaction_id, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(peer, rep),
        };
        if !taken {
            self.counters.unmatched += 1;
        }
    }

    /// The next MAD to send, and to which peer.
    pub fn poll_transmit(&mut self) -> Option<(Peer, Box<[u8; MAD_LEN]>)> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline of any connection or SIDR exchange.
    pub fn poll_timeout(&self) -> Option<u64> {
        let conns = self.conns.values().filter_map(|c| c.deadline);
        let held = self.held.iter().map(HeldReq::until);
        conns.chain(self.sidrs.values().map(|s| s.deadline)).chain(held).min()
    }

    /// Sends again what is unanswered past its deadline, or gives the connection up.
    pub fn handle_timeout(&mut self, now: u64) {
        self.sidr_timeouts(now);
        while self.held.front().is_some_and(|h| h.until() <= now) {
            if let Some(h) = self.held.pop_front() {
                self.refuse_req(h.peer, h.tid, &h.req, reason::INVALID_SERVICE_ID);
            }
        }
        let due: Vec<CommId> =
            self.conns.iter().filter(|(_, c)| c.deadline.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        for id in due {
            let Some(mut conn) = self.take(id) else { continue };
            if conn.state == State::TimeWait {
                self.unlink(id, &conn);
                self.events.push_back(CmEvent::TimewaitExit { id });
                continue;
            }
            if conn.retries_left > 0 {
                conn.retries_left -= 1;
                conn.deadline = Some(now + conn.wait_ns);
                self.out.push_back((conn.peer, conn.last.clone()));
                self.counters.resent += 1;
                self.put(id, conn);
                continue;
            }
            // Out of retries.
            self.counters.timeouts += 1;
            match conn.state {
                // A DREQ nobody answered: disconnected all the same, and the time wait follows
                // (Linux's DREQ_ERROR, then TIMEWAIT_EXIT).
                State::DreqSent => {
                    conn.enter_time_wait(now + self.time_wait_ns);
                    self.put(id, conn);
                    self.events.push_back(CmEvent::Disconnected { id, timed_out: true });
                }
                _ => {
                    self.unlink(id, &conn);
                    let mut rej = CmRej {
                        local_comm_id: id,
                        remote_comm_id: conn.remote_comm_id,
                        message_rejected: rejected::OTHER,
                        reason: reason::TIMEOUT,
                        ..Default::default()
                    };
                    set_timeout_ari(&mut rej, conn.local_ca_guid);
                    self.send_once(conn.peer, conn.tid, CmMessage::Rej(Box::new(rej)));
                    self.events.push_back(CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: Vec::new() });
                }
            }
        }
    }

    fn on_req(&mut self, now: u64, peer: Peer, tid: u64, req: Box<CmReq>) -> bool {
        if let Some(&id) = self.by_remote.get(&(peer, req.local_comm_id)) {
            // A repeated REQ: the REP again if one went out; else the consumer is deciding
            // (an MRA would buy time; the requester's retries wait meanwhile).
            self.counters.duplicates += 1;
            if let Some(conn) = self.conns.get(&id) {
                match conn.state {
                    State::RepSent | State::Established => self.out.push_back((peer, conn.last.clone())),
                    State::ReqRcvd => {
                        // The consumer is still deciding and the requester's timer ran out: an
                        // MRA buys it time, as Linux's CM sends one (rdma_cm asks for it with
                        // CMA_CM_MRA_SETTING: delayed until a REQ comes again, 2^24 x 4.096 us).
                        let mra = CmMra {
                            local_comm_id: id,
                            remote_comm_id: conn.remote_comm_id,
                            message_mraed: mraed::REQ,
                            service_timeout: MRA_SERVICE_TIMEOUT,
                            ..Default::default()
                        };
                        let tid = conn.tid;
                        self.send_once(peer, tid, CmMessage::Mra(Box::new(mra)));
                    }
                    _ => {}
                }
            }
            return true;
        }
        let unheard = !self.listening.contains_key(&req.service_id);
        if unheard && self.reserved.contains_key(&req.service_id) {
            let held = |h: &HeldReq| h.peer == peer && h.req.local_comm_id == req.local_comm_id;
            if self.held.iter().any(held) {
                self.counters.duplicates += 1;
                return true;
            }
            if self.held.len() < MAX_HELD_REQS {
                self.counters.held_for_listen += 1;
                self.held.push_back(HeldReq { service_id: req.service_id, peer, tid, req, came: now });
                return true;
            }
        }
        let refuse = if unheard {
            Some(reason::INVALID_SERVICE_ID)
        } else if self.pending >= self.max_pending {
            self.counters.rejected_backlog += 1;
            Some(reason::NO_RESOURCES)
        } else if self.is_stale(peer, req.local_qpn) {
            // Linux's cm_req_handler (cm_insert_remote_qpn): a new REQ from a QP this CM is
            // connected to already is refused, the old connection left as it is. Connections
            // in time-wait do not count here (a QPN reused right after a disconnect is taken).
            self.counters.rejected_stale += 1;
            Some(reason::STALE_CONNECTION)
        } else {
            None
        };
        if let Some(reason) = refuse {
            self.refuse_req(peer, tid, &req, reason);
            return true;
        }
        let id = self.fresh_id();
        let conn = Conn {
            state: State::ReqRcvd,
            requester: false,
            peer,
            remote_comm_id: req.local_comm_id,
            tid,
            last: Box::new([0; MAD_LEN]),
            retries_left: req.max_cm_retries,
            // The requester said how long it takes to answer (our REP): its Local CM
            // Response Timeout.
            wait_ns: cm_timeout_ns(req.local_cm_response_timeout),
            deadline: None,
            local_qpn: 0,
            remote_qpn: req.local_qpn,
            remote_psn: req.starting_psn,
            max_retries: req.max_cm_retries,
            rep: None,
            hold_rtu: false,
            local_ca_guid: 0,
            xrc: xrc::is(&req),
        };
        self.put(id, conn);
        self.by_remote.insert((peer, req.local_comm_id), id);
        self.events.push_back(CmEvent::ConnectRequest { id, peer, req });
        true
    }

    /// Linux's cm_req_handler -> cm_match_req -> cm_issue_rej: REJ with the REQ's transaction
    /// ID, Remote Communication ID its Local one, Message REJected REQ.
    fn refuse_req(&mut self, peer: Peer, tid: u64, req: &CmReq, reason: u16) {
        if reason == reason::INVALID_SERVICE_ID {
            self.counters.rejected_no_listener += 1;
        }
        let rej =
            CmRej { remote_comm_id: req.local_comm_id, message_rejected: rejected::REQ, reason, ..Default::default() };
        self.send_once(peer, tid, CmMessage::Rej(Box::new(rej)));
    }

    /// Whether `peer`'s QP `qpn` is in a connection of this CM already (not in time-wait).
    fn is_stale(&self, peer: Peer, qpn: u32) -> bool {
        self.conns.values().any(|c| c.peer == peer && c.remote_qpn == qpn && c.state != State::TimeWait)
    }

    /// The connection `id` if it is `peer`'s and its peer's communication ID is `remote_id`
    /// (or still unknown, for a requester waiting for the REP).
    fn matching(&self, id: CommId, peer: Peer, remote_id: u32) -> Option<&Conn> {
        self.conns.get(&id).filter(|c| c.peer == peer && (c.remote_comm_id == remote_id || c.state == State::ReqSent))
    }

    fn on_rep(&mut self, peer: Peer, rep: &CmRep) -> bool {
        let id = rep.remote_comm_id;
        let Some(conn) = self.matching(id, peer, rep.local_comm_id) else { return false };
        match conn.state {
            State::ReqSent => {
                let Some(mut conn) = self.take(id) else { return false };
                let qpn = if conn.xrc { xrc::qpn(rep) } else { rep.local_qpn };
                conn.remote_comm_id = rep.local_comm_id;
                conn.remote_qpn = qpn;
                conn.remote_psn = rep.starting_psn;
                conn.state = State::Established;
                conn.deadline = None;
                conn.rep = Some(Box::new(CmRep { local_qpn: qpn, ..rep.clone() }));
                let rtu = CmRtu { local_comm_id: id, remote_comm_id: rep.local_comm_id, ..Default::default() };
                let mad = self.build(conn.tid, &CmMessage::Rtu(Box::new(rtu)));
                conn.last = mad.clone();
                if !conn.hold_rtu {
                    self.out.push_back((peer, mad));
                }
                self.events.push_back(CmEvent::Established { id, remote_qpn: qpn, remote_psn: rep.starting_psn });
                self.put(id, conn);
                true
            }
            // A repeated REP: its RTU was lost (or is still held).
            State::Established if conn.requester => {
                if !conn.hold_rtu {
                    self.out.push_back((peer, conn.last.clone()));
                }
                self.counters.duplicates += 1;
                true
            }
            // A REP still repeating after a side disconnected: the DREQ says enough.
            State::DreqSent | State::DreqRcvd | State::TimeWait if conn.requester => {
                self.counters.duplicates += 1;
                true
            }
            _ => false,
        }
    }

    fn on_rtu(&mut self, peer: Peer, rtu: &CmRtu) -> bool {
        let id = rtu.remote_comm_id;
        let Some(conn) = self.matching(id, peer, rtu.local_comm_id) else { return false };
        match conn.state {
            State::RepSent => {
                self.establish_responder(id);
                true
            }
            State::Established | State::DreqSent | State::DreqRcvd | State::TimeWait if !conn.requester => {
                self.counters.duplicates += 1;
                true
            }
            _ => false,
        }
    }

    /// A REJ names the connection by this side's ID, or (reason Timeout: the peer may not
    /// know it) by the peer's, as Linux's `cm_acquire_rejected_id` looks it up.
    fn on_rej(&mut self, now: u64, peer: Peer, rej: &CmRej) -> bool {
        let id = if self.matching(rej.remote_comm_id, peer, rej.local_comm_id).is_some() {
            rej.remote_comm_id
        } else if let Some(&id) =
            self.by_remote.get(&(peer, rej.local_comm_id)).filter(|_| rej.reason == reason::TIMEOUT)
        {
            id
        } else {
            return false;
        };
        let Some(state) = self.conns.get(&id).map(|c| c.state) else { return false };
        let private_data = rej.private_data.to_vec();
        match state {
            State::ReqSent | State::ReqRcvd | State::RepSent => {
                self.forget(id);
                self.events.push_back(CmEvent::Rejected { id, reason: rej.reason, private_data });
            }
            // The peer gave up a connection this side thought made (its RTUs were all lost)
            // or is taking apart: Linux enters TimeWait and reports the REJ.
            State::Established | State::DreqSent => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.enter_time_wait(now + self.time_wait_ns);
                }
                self.events.push_back(if state == State::DreqSent {
                    CmEvent::Disconnected { id, timed_out: false }
                } else {
                    CmEvent::Rejected { id, reason: rej.reason, private_data }
                });
            }
            State::TimeWait => self.counters.duplicates += 1,
            // Linux's CM takes no REJ once the peer's DREQ came.
            State::DreqRcvd => return false,
        }
        true
    }

    fn on_mra(&mut self, now: u64, peer: Peer, mra: &CmMra) -> bool {
        let id = mra.remote_comm_id;
        let Some(conn) = self.matching(id, peer, mra.local_comm_id) else { return false };
        let waiting = match conn.state {
            State::ReqSent => mra.message_mraed == mraed::REQ,
            State::RepSent => mra.message_mraed == mraed::REP,
            _ => false,
        };
        if !waiting {
            return false;
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            // The peer needs longer: wait that much more before sending again.
            conn.deadline = Some(now + conn.wait_ns + cm_timeout_ns(mra.service_timeout));
        }
        true
    }

    fn on_dreq(&mut self, peer: Peer, tid: u64, dreq: &CmDreq) -> bool {
        let id = dreq.remote_comm_id;
        let drep = CmDrep { local_comm_id: id, remote_comm_id: dreq.local_comm_id, ..Default::default() };
        let Some(conn) = self.matching(id, peer, dreq.local_comm_id).filter(|c| c.state != State::ReqSent) else {
            // No such connection (any more): a DREP all the same, so the peer stops
            // (Linux's cm_issue_drep). Counted as dropped: it changed nothing here.
            self.send_once(peer, tid, CmMessage::Drep(Box::new(drep)));
            return false;
        };
        // Linux drops a DREQ that names another QP than the connection's.
        if dreq.remote_qpn_eecn != (conn.local_qpn & 0xFF_FFFF) {
            return false;
        }
        match conn.state {
            // The consumer hears of it now and answers with its disconnect (or destroy), as
            // Linux's CM leaves the DREP to rdma_disconnect: until then no timer runs. Both
            // sides disconnecting at once (DREQ Sent) is the same: this side's own DREQ is
            // sent no more, as Linux's cm_dreq_handler cancels it, and the peer that is gone
            // by then (a program that exited) is not waited for.
            State::Established | State::RepSent | State::DreqSent => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.state = State::DreqRcvd;
                    conn.tid = tid;
                    conn.deadline = None;
                }
                self.events.push_back(CmEvent::Disconnected { id, timed_out: false });
            }
            // A repeated DREQ: the DREP again once it went; none while the consumer decides.
            State::TimeWait => {
                self.counters.duplicates += 1;
                self.send_once(peer, tid, CmMessage::Drep(Box::new(drep)));
            }
            State::DreqRcvd => self.counters.duplicates += 1,
            State::ReqSent | State::ReqRcvd => return false,
        }
        true
    }

    fn on_drep(&mut self, now: u64, peer: Peer, drep: &CmDrep) -> bool {
        let id = drep.remote_comm_id;
        let Some(conn) = self.matching(id, peer, drep.local_comm_id) else { return false };
        let state = conn.state;
        match state {
            // The DREP ends this side's DREQ: the time wait. When both sides disconnected at
            // once and the peer's DREQ came first (DREQ Rcvd), Disconnected was already told.
            State::DreqSent | State::DreqRcvd => {
                let until = now + self.time_wait_ns;
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.enter_time_wait(until);
                }
                if state == State::DreqSent {
                    self.events.push_back(CmEvent::Disconnected { id, timed_out: false });
                }
                true
            }
            State::TimeWait => {
                self.counters.duplicates += 1;
                true
            }
            _ => false,
        }
    }

    /// Takes connection `id` out of the table (and out of the pending count).
    fn take(&mut self, id: CommId) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        if conn.state == State::ReqRcvd {
            self.pending -= 1;
        }
        Some(conn)
    }

    /// Puts connection `id` (back) into the table.
    fn put(&mut self, id: CommId, conn: Conn) {
        if conn.state == State::ReqRcvd {
            self.pending += 1;
        }
        self.conns.insert(id, conn);
    }

    /// Removes the repeated-REQ index entry of connection `id`, if it is `id`'s.
    fn unlink(&mut self, id: CommId, conn: &Conn) {
        let key = (conn.peer, conn.remote_comm_id);
        if self.by_remote.get(&key) == Some(&id) {
            self.by_remote.remove(&key);
        }
    }

    /// Sends `m` and keeps it to send again at the deadline.
    fn send_waiting(&mut self, now: u64, conn: &mut Conn, m: CmMessage) {
        let mad = self.build(conn.tid, &m);
        conn.last = mad.clone();
        conn.deadline = Some(now + conn.wait_ns);
        self.out.push_back((conn.peer, mad));
    }

    fn send_once(&mut self, peer: Peer, tid: u64, m: CmMessage) {
        let mad = self.build(tid, &m);
        self.out.push_back((peer, mad));
    }

    fn build(&self, tid: u64, m: &CmMessage) -> Box<[u8; MAD_LEN]> {
        let mut mad = Box::new([0u8; MAD_LEN]);
        // The buffer is a whole MAD: emit cannot fail.
        let _ = m.emit(&MadHeaderRepr::cm(m.attribute_id(), tid), &mut mad[..]);
        mad
    }

    /// Sends a SIDR REQ for `req.service_id` (its Request ID is chosen here) and waits for the
    /// SIDR REP `timeout` (4.096 µs × 2^t) at a time, sending it again up to `max_retries`.
    pub fn sidr_request(&mut self, now: u64, peer: Peer, mut req: CmSidrReq, timeout: u8, max_retries: u8) -> CommId {
        let id = self.fresh_id();
        let tid = self.fresh_tid();
        req.request_id = id;
        let mad = self.build(tid, &CmMessage::SidrReq(Box::new(req)));
        self.out.push_back((peer, mad.clone()));
        let wait_ns = cm_timeout_ns(timeout);
        let sidr = Sidr {
            requester: true,
            peer,
            remote_id: 0,
            tid,
            last: Some(mad),
            retries_left: max_retries,
            wait_ns,
            deadline: now + wait_ns,
        };
        self.sidrs.insert(id, sidr);
        id
    }

    /// Answers SIDR request `id` with `rep` (its Request ID filled in here); the answer is
    /// kept a while to answer a repeated SIDR REQ.
    pub fn sidr_reply(&mut self, now: u64, id: CommId, mut rep: CmSidrRep) -> bool {
        let Some(s) = self.sidrs.get_mut(&id) else { return false };
        if s.requester || s.last.is_some() {
            return false;
        }
        rep.request_id = s.remote_id;
        let (peer, tid) = (s.peer, s.tid);
        let mad = self.build(tid, &CmMessage::SidrRep(Box::new(rep)));
        self.out.push_back((peer, mad.clone()));
        if let Some(s) = self.sidrs.get_mut(&id) {
            s.last = Some(mad);
            s.deadline = now + self.time_wait_ns;
        }
        self.pending -= 1;
        true
    }

    fn on_sidr_req(&mut self, now: u64, peer: Peer, tid: u64, req: Box<CmSidrReq>) -> bool {
        if let Some(id) = self.sidr_by_remote.get(&(peer, req.request_id)) {
            self.counters.duplicates += 1;
            if let Some(last) = self.sidrs.get(id).and_then(|s| s.last.clone()) {
                self.out.push_back((peer, last));
            }
            return true;
        }
        let status = if !self.listening.contains_key(&req.service_id) {
            self.counters.rejected_no_listener += 1;
            sidr_status::UNSUPPORTED
        } else if self.pending >= self.max_pending {
            self.counters.rejected_backlog += 1;
            sidr_status::NO_QP
        } else {
            sidr_status::SUCCESS
        };
        if status != sidr_status::SUCCESS {
            let rep =
                CmSidrRep { request_id: req.request_id, status, service_id: req.service_id, ..Default::default() };
            self.send_once(peer, tid, CmMessage::SidrRep(Box::new(rep)));
            return true;
        }
        let id = self.fresh_id();
        // Kept until answered, and a while after; a consumer that never answers lets it go
        // with the time-wait deadline too.
        let sidr = Sidr {
            requester: false,
            peer,
            remote_id: req.request_id,
            tid,
            last: None,
            retries_left: 0,
            wait_ns: 0,
            deadline: now + self.time_wait_ns,
        };
        self.sidrs.insert(id, sidr);
        self.sidr_by_remote.insert((peer, req.request_id), id);
        self.pending += 1;
        self.events.push_back(CmEvent::SidrRequest { id, peer, req });
        true
    }

    fn on_sidr_rep(&mut self, peer: Peer, rep: Box<CmSidrRep>) -> bool {
        let id = rep.request_id;
        if !self.sidrs.get(&id).is_some_and(|s| s.requester && s.peer == peer) {
            return false;
        }
        self.sidrs.remove(&id);
        self.events.push_back(CmEvent::SidrReply { id, rep });
        true
    }

    /// SIDR REQs sent again or given up; answered requests forgotten.
    fn sidr_timeouts(&mut self, now: u64) {
        let due: Vec<CommId> = self.sidrs.iter().filter(|(_, s)| s.deadline <= now).map(|(id, _)| *id).collect();
        for id in due {
            let Some(mut s) = self.sidrs.remove(&id) else { continue };
            if !s.requester {
                self.sidr_by_remote.remove(&(s.peer, s.remote_id));
                if s.last.is_none() {
                    self.pending -= 1; // never answered
                }
                continue;
            }
            match (s.retries_left, s.last.clone()) {
                (1.., Some(mad)) => {
                    s.retries_left -= 1;
                    s.deadline = now + s.wait_ns;
                    self.out.push_back((s.peer, mad));
                    self.counters.resent += 1;
                    self.sidrs.insert(id, s);
                }
                _ => {
                    self.counters.timeouts += 1;
                    self.events.push_back(CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: Vec::new() });
                }
            }
        }
    }

    /// Forgets SIDR exchange `id` (its consumer is gone); an unanswered request is refused.
    fn forget_sidr(&mut self, id: CommId) {
        let Some(s) = self.sidrs.remove(&id) else { return };
        if !s.requester {
            self.sidr_by_remote.remove(&(s.peer, s.remote_id));
            if s.last.is_none() {
                self.pending -= 1;
                let rep = CmSidrRep { request_id: s.remote_id, status: sidr_status::REJECT, ..Default::default() };
                self.send_once(s.peer, s.tid, CmMessage::SidrRep(Box::new(rep)));
            }
        }
    }

    /// Refuses SIDR request `id` with `status` (REJECT for a consumer's reject).
    pub fn sidr_reject(&mut self, id: CommId, status: u8, private_data: &[u8]) -> bool {
        let Some(s) = self.sidrs.get(&id) else { return false };
        if s.requester || s.last.is_some() {
            return false;
        }
        let mut rep = CmSidrRep { status, ..Default::default() };
        let n = private_data.len().min(rep.private_data.len());
        rep.private_data[..n].copy_from_slice(&private_data[..n]);
        self.sidr_reply_raw(id, rep)
    }

    fn sidr_reply_raw(&mut self, id: CommId, mut rep: CmSidrRep) -> bool {
        let Some(s) = self.sidrs.remove(&id) else { return false };
        self.sidr_by_remote.remove(&(s.peer, s.remote_id));
        self.pending -= 1;
        rep.request_id = s.remote_id;
        self.send_once(s.peer, s.tid, CmMessage::SidrRep(Box::new(rep)));
        true
    }

    fn fresh_id(&mut self) -> CommId {
        loop {
            self.next_id = self.next_id.wrapping_add(0x9E37_79B9);
            if self.next_id != 0 && !self.conns.contains_key(&self.next_id) && !self.sidrs.contains_key(&self.next_id) {
                return self.next_id;
            }
        }
    }

    fn fresh_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }
}
