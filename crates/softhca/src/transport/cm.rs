//! The communication manager's state machine (IBA 12.9), sans-IO like the rest of the
//! transport: MADs in with `now`, MADs out, deadlines, and events for the consumer. It knows
//! nothing of QPs or sockets: the consumer moves its QP through the states the events call for
//! (a REP is the requester's cue for RTR and RTS, a REQ the responder's for RTR), and the
//! driver carries the MADs to and from the GSI (QP1).
//!
//! What it does: REQ / REP / RTU to connect, REJ with its reasons (Table 109), MRA to ask for
//! more time, DREQ / DREP to disconnect; every message that wants an answer is sent again after
//! the CM response timeout the peer asked for, up to the Max CM Retries of the REQ, then the
//! connection fails with REJ Timeout (4). Duplicates are answered, never taken twice: a REQ
//! again gets the REP again, a REP again the RTU again, a DREQ again the DREP again.
//!
//! `verbs::CmAgent` runs it on a device's QP1. Not yet: LAP/APR (path migration), SIDR,
//! stale-connection detection by QPN, and `librdmacm` on top (issue 14).

use std::collections::{BTreeMap, VecDeque};

use crate::wire::mad::{CmDrep, CmDreq, CmMessage, CmRej, CmRep, CmReq, CmRtu, MadHeaderRepr, MAD_LEN};

/// REJ reasons of IBA Table 109 that this machine gives.
pub mod reason {
    pub const NO_QP: u16 = 1;
    pub const TIMEOUT: u16 = 4;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const CONSUMER_REJECT: u16 = 28;
}

/// A connection, by its local communication ID.
pub type CommId = u32;

/// The peer's GSI: its GID (RoCE addresses GSIs by GID).
pub type Peer = [u8; 16];

/// What the consumer learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened service: accept or reject it.
    ConnectRequest { id: CommId, peer: Peer, req: Box<CmReq> },
    /// Connected: the requester got the REP (and sent the RTU), or the responder the RTU.
    Established { id: CommId, remote_qpn: u32, remote_psn: u32 },
    /// The peer rejected (or a retry count ran out: reason 4 Timeout, no private data).
    Rejected { id: CommId, reason: u16, private_data: Vec<u8> },
    /// A DREQ / DREP exchange ended the connection (or its retries ran out).
    Disconnected { id: CommId },
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
    /// Disconnected; kept a while to answer a repeated DREQ.
    TimeWait,
}

struct Conn {
    state: State,
    peer: Peer,
    remote_comm_id: u32,
    tid: u64,
    /// The last message that wants an answer (or that answers a repeated request).
    last: Box<[u8; MAD_LEN]>,
    retries_left: u8,
    /// How long the peer said to wait for it before sending again, in ns.
    wait_ns: u64,
    deadline: Option<u64>,
    remote_qpn: u32,
    remote_psn: u32,
    /// The REQ's Max CM Retries, for every message of the connection.
    max_retries: u8,
    /// Requester: the REP that answered (its private data and resources are the consumer's).
    rep: Option<Box<CmRep>>,
}

/// One port's connection manager.
pub struct Cm {
    conns: BTreeMap<CommId, Conn>,
    /// Responder connections by (peer, peer's comm ID): to recognise a repeated REQ.
    by_remote: BTreeMap<(Peer, u32), CommId>,
    listening: BTreeMap<u64, ()>,
    out: VecDeque<(Peer, Box<[u8; MAD_LEN]>)>,
    events: VecDeque<CmEvent>,
    next_id: u32,
    next_tid: u64,
    /// How long a disconnected connection stays to answer repeated DREQs.
    time_wait_ns: u64,
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
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_id: seed | 1,
            next_tid: u64::from(seed) << 32,
            time_wait_ns: 1_000_000_000,
        }
    }

    pub fn listen(&mut self, service_id: u64) {
        self.listening.insert(service_id, ());
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
            peer,
            remote_comm_id: 0,
            tid,
            last: Box::new([0; MAD_LEN]),
            retries_left: req.max_cm_retries,
            wait_ns: cm_timeout_ns(req.remote_cm_response_timeout),
            deadline: None,
            remote_qpn: 0,
            remote_psn: 0,
            max_retries: req.max_cm_retries,
            rep: None,
        };
        self.send_waiting(now, &mut conn, CmMessage::Req(Box::new(req)));
        self.conns.insert(id, conn);
        id
    }

    /// The REP that answered the REQ of requester connection `id`.
    pub fn reply(&self, id: CommId) -> Option<&CmRep> {
        self.conns.get(&id)?.rep.as_deref()
    }

    /// Accepts a REQ with the REP a minimal consumer sends.
    pub fn accept(&mut self, now: u64, id: CommId, local_qpn: u32, starting_psn: u32) -> bool {
        self.reply_with(now, id, CmRep { local_qpn, starting_psn, rnr_retry_count: 7, ..Default::default() })
    }

    /// Accepts a REQ: sends `rep` (its communication IDs filled in here) and waits for the RTU.
    pub fn reply_with(&mut self, now: u64, id: CommId, mut rep: CmRep) -> bool {
        let Some(mut conn) = self.conns.remove(&id) else { return false };
        if conn.state != State::ReqRcvd {
            self.conns.insert(id, conn);
            return false;
        }
        rep.local_comm_id = id;
        rep.remote_comm_id = conn.remote_comm_id;
        conn.state = State::RepSent;
        conn.retries_left = conn.max_retries;
        self.send_waiting(now, &mut conn, CmMessage::Rep(Box::new(rep)));
        self.conns.insert(id, conn);
        true
    }

    /// Rejects a REQ (reason 28, Consumer Reject, unless told otherwise).
    pub fn reject(&mut self, id: CommId, reason: u16) -> bool {
        self.reject_with(id, reason, &[])
    }

    /// Rejects a REQ (or a REP, as a requester) with `private_data` (at most 148 bytes kept).
    pub fn reject_with(&mut self, id: CommId, reason: u16, private_data: &[u8]) -> bool {
        let Some(conn) = self.conns.remove(&id) else { return false };
        self.by_remote.remove(&(conn.peer, conn.remote_comm_id));
        let mut rej = CmRej {
            local_comm_id: id,
            remote_comm_id: conn.remote_comm_id,
            message_rejected: if conn.state == State::ReqRcvd { 0 } else { 1 },
            reason,
            ..Default::default()
        };
        let n = private_data.len().min(rej.private_data.len());
        rej.private_data[..n].copy_from_slice(&private_data[..n]);
        self.send_once(conn.peer, conn.tid, CmMessage::Rej(Box::new(rej)));
        true
    }

    /// Forgets connection `id` as the consumer destroys it, telling the peer as Linux's CM
    /// does: a REQ or REP still unanswered is rejected (Timeout for the requester, Consumer
    /// Reject for the responder), an established connection gets a DREQ, sent once.
    pub fn destroy(&mut self, id: CommId) {
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
            State::DreqSent | State::TimeWait => self.forget(id),
        }
    }

    fn forget(&mut self, id: CommId) {
        if let Some(conn) = self.conns.remove(&id) {
            self.by_remote.remove(&(conn.peer, conn.remote_comm_id));
        }
    }

    /// Starts disconnecting an established connection: sends the DREQ.
    pub fn disconnect(&mut self, now: u64, id: CommId) -> bool {
        let Some(mut conn) = self.conns.remove(&id) else { return false };
        if conn.state != State::Established {
            self.conns.insert(id, conn);
            return false;
        }
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
        self.conns.insert(id, conn);
        true
    }

    /// One MAD received from `peer`'s GSI. Anything that does not parse, or names no
    /// connection, is dropped (a REQ for a service nobody listens to is rejected).
    pub fn handle_mad(&mut self, now: u64, peer: Peer, mad: &[u8]) {
        let Ok((h, m)) = CmMessage::parse(mad) else { return };
        match m {
            CmMessage::Req(req) => self.on_req(peer, h.transaction_id, req),
            CmMessage::Rep(rep) => self.on_rep(peer, &rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu.remote_comm_id),
            CmMessage::Rej(rej) => self.on_rej(peer, &rej),
            CmMessage::Mra(mra) => self.on_mra(now, mra.remote_comm_id, mra.service_timeout),
            CmMessage::Dreq(dreq) => self.on_dreq(now, peer, h.transaction_id, &dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep.remote_comm_id),
            CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => {}
        }
    }

    /// The next MAD to send, and to which peer.
    pub fn poll_transmit(&mut self) -> Option<(Peer, Box<[u8; MAD_LEN]>)> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline of any connection.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Sends again what is unanswered past its deadline, or gives the connection up.
    pub fn handle_timeout(&mut self, now: u64) {
        let due: Vec<CommId> =
            self.conns.iter().filter(|(_, c)| c.deadline.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        for id in due {
            let Some(mut conn) = self.conns.remove(&id) else { continue };
            if conn.state == State::TimeWait {
                self.by_remote.remove(&(conn.peer, conn.remote_comm_id));
                continue;
            }
            if conn.retries_left > 0 {
                conn.retries_left -= 1;
                conn.deadline = Some(now + conn.wait_ns);
                self.out.push_back((conn.peer, conn.last.clone()));
                self.conns.insert(id, conn);
                continue;
            }
            // Out of retries.
            self.by_remote.remove(&(conn.peer, conn.remote_comm_id));
            match conn.state {
                State::DreqSent => self.events.push_back(CmEvent::Disconnected { id }),
                _ => {
                    let rej = CmRej {
                        local_comm_id: id,
                        remote_comm_id: conn.remote_comm_id,
                        reason: reason::TIMEOUT,
                        ..Default::default()
                    };
                    self.send_once(conn.peer, conn.tid, CmMessage::Rej(Box::new(rej)));
                    self.events.push_back(CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: Vec::new() });
                }
            }
        }
    }

    fn on_req(&mut self, peer: Peer, tid: u64, req: Box<CmReq>) {
        if let Some(&id) = self.by_remote.get(&(peer, req.local_comm_id)) {
            // A repeated REQ: the REP again if one went out; else the consumer is deciding
            // (an MRA would buy time; the requester's retries wait meanwhile).
            if let Some(conn) = self.conns.get(&id) {
                if matches!(conn.state, State::RepSent | State::Established) {
                    self.out.push_back((peer, conn.last.clone()));
                }
            }
            return;
        }
        if !self.listening.contains_key(&req.service_id) {
            let rej =
                CmRej { remote_comm_id: req.local_comm_id, reason: reason::INVALID_SERVICE_ID, ..Default::default() };
            self.send_once(peer, tid, CmMessage::Rej(Box::new(rej)));
            return;
        }
        let id = self.fresh_id();
        let conn = Conn {
            state: State::ReqRcvd,
            peer,
            remote_comm_id: req.local_comm_id,
            tid,
            last: Box::new([0; MAD_LEN]),
            retries_left: req.max_cm_retries,
            // The requester said how long it takes to answer (our REP): its Local CM
            // Response Timeout.
            wait_ns: cm_timeout_ns(req.local_cm_response_timeout),
            deadline: None,
            remote_qpn: req.local_qpn,
            remote_psn: req.starting_psn,
            max_retries: req.max_cm_retries,
            rep: None,
        };
        self.conns.insert(id, conn);
        self.by_remote.insert((peer, req.local_comm_id), id);
        self.events.push_back(CmEvent::ConnectRequest { id, peer, req });
    }

    fn on_rep(&mut self, peer: Peer, rep: &CmRep) {
        let id = rep.remote_comm_id;
        let Some(mut conn) = self.conns.remove(&id) else { return };
        match conn.state {
            State::ReqSent if conn.peer == peer => {
                conn.remote_comm_id = rep.local_comm_id;
                conn.remote_qpn = rep.local_qpn;
                conn.remote_psn = rep.starting_psn;
                conn.state = State::Established;
                conn.deadline = None;
                conn.rep = Some(Box::new(rep.clone()));
                let rtu = CmRtu { local_comm_id: id, remote_comm_id: rep.local_comm_id, ..Default::default() };
                let mad = self.build(conn.tid, &CmMessage::Rtu(Box::new(rtu)));
                conn.last = mad.clone();
                self.out.push_back((peer, mad));
                self.events.push_back(CmEvent::Established {
                    id,
                    remote_qpn: rep.local_qpn,
                    remote_psn: rep.starting_psn,
                });
            }
            // A repeated REP: its RTU was lost.
            State::Established if conn.remote_comm_id == rep.local_comm_id => {
                self.out.push_back((peer, conn.last.clone()));
            }
            _ => {}
        }
        self.conns.insert(id, conn);
    }

    fn on_rtu(&mut self, id: CommId) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        if conn.state == State::RepSent {
            conn.state = State::Established;
            conn.deadline = None;
            let (remote_qpn, remote_psn) = (conn.remote_qpn, conn.remote_psn);
            self.events.push_back(CmEvent::Established { id, remote_qpn, remote_psn });
        }
    }

    fn on_rej(&mut self, peer: Peer, rej: &CmRej) {
        let id = rej.remote_comm_id;
        let connecting =
            |c: &Conn| c.peer == peer && matches!(c.state, State::ReqSent | State::RepSent | State::ReqRcvd);
        if !self.conns.get(&id).is_some_and(connecting) {
            return;
        }
        if let Some(conn) = self.conns.remove(&id) {
            self.by_remote.remove(&(conn.peer, conn.remote_comm_id));
            let private_data = rej.private_data.to_vec();
            self.events.push_back(CmEvent::Rejected { id, reason: rej.reason, private_data });
        }
    }

    fn on_mra(&mut self, now: u64, id: CommId, service_timeout: u8) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if matches!(conn.state, State::ReqSent | State::RepSent) {
                // The peer needs longer: wait that much more before sending again.
                conn.deadline = Some(now + conn.wait_ns + cm_timeout_ns(service_timeout));
            }
        }
    }

    fn on_dreq(&mut self, now: u64, peer: Peer, tid: u64, dreq: &CmDreq) {
        let id = dreq.remote_comm_id;
        let Some(mut conn) = self.conns.remove(&id) else {
            // No such connection (any more): a DREP all the same, so the peer stops.
            let drep = CmDrep { remote_comm_id: dreq.local_comm_id, ..Default::default() };
            self.send_once(peer, tid, CmMessage::Drep(Box::new(drep)));
            return;
        };
        if conn.peer != peer {
            self.conns.insert(id, conn);
            return;
        }
        let drep = CmDrep { local_comm_id: id, remote_comm_id: dreq.local_comm_id, ..Default::default() };
        let mad = self.build(tid, &CmMessage::Drep(Box::new(drep)));
        self.out.push_back((peer, mad.clone()));
        if matches!(conn.state, State::Established | State::DreqSent) {
            self.events.push_back(CmEvent::Disconnected { id });
        }
        conn.state = State::TimeWait;
        conn.last = mad;
        conn.deadline = Some(now + self.time_wait_ns);
        self.conns.insert(id, conn);
    }

    fn on_drep(&mut self, now: u64, id: CommId) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        if conn.state == State::DreqSent {
            conn.state = State::TimeWait;
            conn.deadline = Some(now + self.time_wait_ns);
            self.events.push_back(CmEvent::Disconnected { id });
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

    fn fresh_id(&mut self) -> CommId {
        loop {
            self.next_id = self.next_id.wrapping_add(0x9E37_79B9);
            if self.next_id != 0 && !self.conns.contains_key(&self.next_id) {
                return self.next_id;
            }
        }
    }

    fn fresh_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }
}
