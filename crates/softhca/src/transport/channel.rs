//! One end of a reliable channel (IBA 9.7): what an RC QP and an RD EEC both keep, one type
//! for the two services so that each rule of the digest lives in one place.
//!
//! - [`SendSeq`], the requester's half: the next PSN, the Retry and RNR Retry budgets
//!   (PKT-RTY-7, PKT-RNR-5), the Local ACK and RNR timers and the go-back-N recovery mark.
//! - [`RecvSeq`], the responder's half: ePSN, MSN and the PSN Sequence Error NAK already sent
//!   (PKT-PSN-4..6).
//! - [`Outbox`]: the responses waiting to leave in order (ORD-RLX-4), ACKs coalesced
//!   (PKT-ACK-4), and the turn between responses and the channel's own requests.
//! - The inbound RDMA Read / Atomic resources (PKT-DUP-2..5, ERR-RQ-6): the one executor of an
//!   inbound Read and of an inbound Atomic, and the replay of a duplicate request.
//!
//! What the PSNs belong to stays with the owner: an RC requester's SQ cursor over many WQEs,
//! an EEC's one message. The owner addresses a response with `A` (RC: `()`, the QP has one
//! peer; RD: the pair of QPs, as the channel carries many).
//!
//! Imports: the ground floor, `wire`, and the transport's timer queue, `hca` and responder
//! executors below it.

use std::collections::VecDeque;

use crate::mem::MemRef;
use crate::types::WcStatus;
use crate::wire::aeth::{rnr_timer_us, NakCode, Syndrome};
use crate::wire::opcode::{Operation, Position, ServiceType, Suffix};
use crate::wire::psn::{Psn, PsnClass};
use crate::wire::{AethRepr, AtomicAckEthRepr, BthRepr, Opcode, PacketRepr};

use super::completer::scatter;
use super::engine::{Payload, TimerOwner};
use super::hca::Hca;
use super::responder::{
    begin_read, read_rest_matches, run_atomic, run_atomic_write, Grant, ReadPlan, Refusal, Request, RespJob,
};

/// Local ACK Timeout in ns: 4.096 µs × 2^timeout; 0 disables the timer (PKT-RTY-2).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// The two retry budgets of a requester: Retry Count for timeouts and sequence NAKs
/// (PKT-RTY-7: 7 is an ordinary count) and RNR Retry Count (PKT-RNR-5: 7 never runs out).
/// Both are reloaded when a request is acknowledged (PKT-RTY-5, PKT-RNR-8).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Retries {
    retry_left: u8,
    rnr_left: u8,
}

impl Retries {
    pub fn new(retry_cnt: u8, rnr_retry: u8) -> Retries {
        Retries { retry_left: retry_cnt, rnr_left: rnr_retry }
    }

    /// Takes one retry; false when none is left.
    fn take_retry(&mut self) -> bool {
        let left = self.retry_left > 0;
        self.retry_left = self.retry_left.saturating_sub(1);
        left
    }

    /// Takes one RNR retry; false when none is left (never with an RNR Retry Count, the
    /// channel's current one, of 7).
    fn take_rnr(&mut self, rnr_retry: u8) -> bool {
        if rnr_retry == 7 {
            return true;
        }
        let left = self.rnr_left > 0;
        self.rnr_left = self.rnr_left.saturating_sub(1);
        left
    }
}

/// What a go-back costs (see [`SendSeq::retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Already going back to that packet: a later response to the packets in flight before
    /// the recovery repeats the NAK and costs nothing.
    Recovering,
    /// Go back: one retry was taken.
    Back,
    /// No retry was left (Transport Retry Counter Exceeded, unless the owner has another path).
    Exhausted,
}

/// One end of a reliable channel: an RC QP's (UC and UD use its sequence numbers), an RD EEC's.
#[derive(Debug)]
pub(crate) struct Channel<A> {
    pub send: SendSeq,
    pub recv: RecvSeq,
    pub out: Outbox<A>,
}

impl<A> Default for Channel<A> {
    fn default() -> Self {
        Channel { send: SendSeq::default(), recv: RecvSeq::default(), out: Outbox::default() }
    }
}

/// The requester's half of a reliable channel.
#[derive(Debug, Default, Clone)]
pub(crate) struct SendSeq {
    /// The PSN the next new request packet gets.
    pub psn: u32,
    pub retries: Retries,
    pub ack_deadline: Option<u64>,
    pub rnr_deadline: Option<u64>,
    /// The deadline of the owner's earliest entry in the engine's timer queue.
    pub timer_queued: Option<u64>,
    /// Went back to this PSN (RD: packet index) and waits for it to be answered: responses
    /// beyond it still in flight from before are the old ones and must not count as new NAKs.
    pub recovering: Option<u32>,
    /// Where a timeout's go-back stands (see [`SendSeq::retry`]).
    pub probe: Probe,
}

/// A Local ACK timeout's go-back starts with a probe: the oldest unacknowledged packet goes
/// out alone, with AckReq, and the rest follows its answer, from the first packet that answer
/// leaves unacknowledged. PKT-RTY-1 fixes where the retransmission starts, not its pace. A
/// timeout means the responses stopped: lost, or queued at a receiver that cannot keep up,
/// and resending the whole window into such a receiver feeds the backlog the answers are
/// stuck in (against Linux rxe in an emulated guest, 3 of every 4 packets softhca sent were
/// such retransmissions, the ACKs that would have stopped them were read too late, and Retry
/// Count ran out). The probe costs one packet, and a responder answers a duplicate with an ACK
/// of everything it has (PKT-DUP-1), which ends the go-back at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Probe {
    #[default]
    Off,
    /// The next request packet is the probe: it goes out alone, with AckReq.
    Due,
    /// The probe is out: nothing follows it until a response (or the next timeout).
    Sent,
}

impl SendSeq {
    /// At RTR→RTS: the first request carries the SQ Start PSN (MOD-RTR-RTS-2) and both budgets
    /// are full.
    pub fn start(&mut self, psn: u32, retry_cnt: u8, rnr_retry: u8) {
        *self = SendSeq { psn, retries: Retries::new(retry_cnt, rnr_retry), ..Default::default() };
    }

    /// Going back to `from` costs one retry (PKT-RTY-3, PKT-NAK-1): once per recovery for a
    /// NAK or an implied NAK, every time for a timeout (PKT-RTY-1).
    pub fn retry(&mut self, from: u32, timeout: bool) -> Retry {
        if !timeout && self.recovering == Some(from) {
            return Retry::Recovering;
        }
        self.recovering = Some(from);
        if timeout {
            // Also when no retry is left: a QP that migrates to its alternate path then
            // probes there (and the probe of the last retry is answered no more).
            self.probe = Probe::Due;
        }
        if self.retries.take_retry() {
            Retry::Back
        } else {
            Retry::Exhausted
        }
    }

    /// Whether a request packet may go out now: not while a probe waits for its answer.
    pub fn may_send(&self) -> bool {
        self.probe != Probe::Sent
    }

    /// Whether the next request packet is a probe (it asks for an ACK).
    pub fn probe_due(&self) -> bool {
        self.probe == Probe::Due
    }

    /// A response arrived: a probe is over, and the go-back goes on in full. True when one was
    /// on (the caller then skips what the response acknowledged).
    pub fn answered(&mut self) -> bool {
        std::mem::take(&mut self.probe) != Probe::Off
    }

    /// A response acknowledged something new: both budgets start again (PKT-RTY-5, PKT-RNR-8).
    pub fn progressed(&mut self, retry_cnt: u8, rnr_retry: u8) {
        self.retries = Retries::new(retry_cnt, rnr_retry);
    }

    /// The recovery is over once `answered` says its packet was answered.
    pub fn end_recovery(&mut self, answered: impl FnOnce(u32) -> bool) {
        if self.recovering.is_some_and(answered) {
            self.recovering = None;
        }
    }

    /// An RNR NAK for `from` (PKT-RNR-2..5): one RNR retry, then the requester waits the NAK's
    /// timer with the ACK timer stopped, going back to `from`. That go-back is a recovery: the
    /// responder's answers to what followed `from` before the wait (a PSN Sequence Error NAK
    /// for the next packet of the same message) repeat it, and neither cost a retry nor start
    /// the ACK timer during the wait. False when no RNR retry was left.
    pub fn rnr_wait(
        &mut self,
        dev: &dyn Hca,
        owner: TimerOwner,
        now: u64,
        (from, timer_code): (u32, u8),
        rnr_retry: u8,
    ) -> bool {
        if !self.retries.take_rnr(rnr_retry) {
            return false;
        }
        self.recovering = Some(from);
        let at = now + rnr_timer_us(timer_code) as u64 * 1000;
        arm(dev, owner, &mut self.timer_queued, &mut self.rnr_deadline, Some(at));
        self.ack_deadline = None;
        true
    }

    /// Arms the Local ACK timer for `at` (from now, `timeout` as the QP's or EEC's attribute),
    /// or stops it.
    pub fn arm_ack(&mut self, dev: &dyn Hca, owner: TimerOwner, at: Option<u64>) {
        arm(dev, owner, &mut self.timer_queued, &mut self.ack_deadline, at);
    }

    /// A request packet left: the Local ACK timer starts unless it runs already.
    pub fn sent(&mut self, dev: &dyn Hca, owner: TimerOwner, now: u64, timeout: u8) {
        if self.probe == Probe::Due {
            self.probe = Probe::Sent;
        }
        if self.ack_deadline.is_none() {
            self.arm_ack(dev, owner, ack_timeout_ns(timeout).map(|t| now + t));
        }
    }

    pub fn stop_timers(&mut self) {
        self.ack_deadline = None;
        self.rnr_deadline = None;
    }

    /// The owner's timer entry `t` is due at `now`. `None` for a stale entry (the owner queued
    /// an earlier one since, or was reset); else an RNR wait that is over has ended, and the
    /// result says whether the Local ACK timer expired (it is then stopped).
    pub fn due(&mut self, t: u64, now: u64) -> Option<bool> {
        if self.timer_queued != Some(t) {
            return None;
        }
        self.timer_queued = None;
        if self.rnr_deadline.is_some_and(|d| d <= now) {
            self.rnr_deadline = None;
        }
        let expired = self.ack_deadline.is_some_and(|d| d <= now);
        if expired {
            self.ack_deadline = None;
        }
        Some(expired)
    }

    /// After `due` and what it led to: the timers still armed go back in the queue.
    pub fn requeue(&mut self, dev: &dyn Hca, owner: TimerOwner) {
        for d in [self.ack_deadline, self.rnr_deadline].into_iter().flatten() {
            dev.engine().timers.schedule(owner, &mut self.timer_queued, d);
        }
    }
}

/// Arms `slot` (one of the timers of `owner`, a QP or an EEC) for `at`, or disarms it, and
/// puts the deadline in the engine's timer queue unless an entry of `owner` already fires no
/// later (`queued` is that entry's deadline; see `engine::TimerQueue`).
fn arm(dev: &dyn Hca, owner: TimerOwner, queued: &mut Option<u64>, slot: &mut Option<u64>, at: Option<u64>) {
    *slot = at;
    if let Some(t) = at {
        dev.engine().timers.schedule(owner, queued, t);
    }
}

/// How an inbound request's PSN stands against ePSN (PKT-PSN-4..6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    Expected,
    Duplicate,
    /// Out of sequence, the first since the last expected packet: NAK it (PKT-PSN-5).
    SequenceError,
    /// Out of sequence again before the expected PSN came: drop it silently (PKT-PSN-6).
    Ignore,
}

/// The responder's half of a reliable channel.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecvSeq {
    pub epsn: u32,
    pub msn: u32,
    /// A PSN Sequence Error NAK was sent and no packet with PSN = ePSN came since.
    nak_sent: bool,
}

impl RecvSeq {
    /// At Init→RTR: ePSN is the RQ Start PSN (MOD-INIT-RTR-RC-1), MSN 0 (PKT-ACK-15).
    pub fn start(&mut self, epsn: u32) {
        *self = RecvSeq { epsn, ..Default::default() };
    }

    pub fn arrival(&mut self, psn: Psn) -> Arrival {
        match psn.classify(Psn::new(self.epsn)) {
            PsnClass::Expected => {
                self.nak_sent = false;
                Arrival::Expected
            }
            PsnClass::Duplicate => Arrival::Duplicate,
            PsnClass::OutOfSequence if self.nak_sent => Arrival::Ignore,
            PsnClass::OutOfSequence => {
                self.nak_sent = true;
                Arrival::SequenceError
            }
        }
    }

    /// An RD Resync: ePSN moves to `epsn`, the MSN goes on, a NAK sent before is forgotten.
    pub fn resync(&mut self, epsn: u32) {
        self.epsn = epsn;
        self.nak_sent = false;
    }

    /// A fatal NAK went out instead: the next sequence error is NAKed again.
    pub fn forget_nak(&mut self) {
        self.nak_sent = false;
    }

    /// A request ended its message (PKT-ACK-14).
    pub fn message_done(&mut self) {
        self.msn = Psn::new(self.msn).next().value();
    }
}

/// An entry of the inbound RDMA Read / Atomic queue: pending until its responses have left,
/// then kept for duplicate replay until a new request needs the slot (PKT-DUP-2, PKT-DUP-5).
#[derive(Debug, Clone)]
struct Resource {
    /// The QP the request was for (an EEC serves many).
    qpn: u32,
    psn: u32,
    kind: ResourceKind,
    pending: bool,
}

#[derive(Debug, Clone)]
enum ResourceKind {
    Read {
        va: u64,
        rkey: u32,
        len: u64,
        npkts: u32,
        mtu: u64,
    },
    Atomic {
        orig: u64,
    },
    /// An Atomic Write executed: a duplicate gets its answer again ([`atomic_write_answer`]).
    AtomicWrite,
}

/// What answers an Atomic Write with PSN `psn`: an RDMA Read Response Only with no payload,
/// as rxe answers it (a zero-length Read's response; its `mtu` cuts nothing).
fn atomic_write_answer(psn: u32) -> RespJob {
    RespJob::ReadResp { grant: None, first_psn: psn, npkts: 1, next: 0, len: 0, mtu: 1 }
}

/// The responses waiting to leave, addressed by `A`, with the Read/Atomic resources behind
/// them.
#[derive(Debug)]
pub(crate) struct Outbox<A> {
    jobs: VecDeque<(A, RespJob)>,
    resources: VecDeque<Resource>,
    /// Responses sent in a row (see [`RESPONSE_BURST`]).
    streak: u8,
    /// Request packets sent while a plain ACK waited at the head (see [`ACK_WAIT`]).
    ack_waited: u8,
}

impl<A> Default for Outbox<A> {
    fn default() -> Self {
        Outbox { jobs: VecDeque::new(), resources: VecDeque::new(), streak: 0, ack_waited: 0 }
    }
}

/// Responses a channel sends in a row, while it has requests waiting, before one of those goes.
pub(crate) const RESPONSE_BURST: u8 = 8;

/// Request packets a plain ACK at the head of the outbox lets go first, on a link that asks
/// (`Engine::acks_after_requests`): a 64 KiB message at a 4096-byte MTU. Bounded, so that a
/// QP streaming requests still acknowledges what it receives.
pub(crate) const ACK_WAIT: u8 = 16;

/// Whom an inbound request is for: the QP (its number and PD, whose keys it may use), where
/// its responses go, and the inbound Read/Atomic depth that applies (RC: the QP's; RD: the
/// smaller of the EEC's and the QP's).
#[derive(Clone, Copy)]
pub(crate) struct Inbound<'d, A> {
    pub to: A,
    pub dev: &'d dyn Hca,
    pub pd: u32,
    pub qpn: u32,
    pub depth: u8,
}

/// What the queue's head job needs the owner to do after [`Outbox::send_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent<A> {
    /// A packet was emitted (`None`: it could not be, and the job was dropped or kept as
    /// before).
    Packet(Option<usize>),
    /// A Read's key no longer covers the bytes of its response `psn`: a Remote Access Error
    /// NAK for it went out instead (`Some(len)`) and the Read was abandoned; the owner applies
    /// its service's error class (RC: Class C, the QP to Error; RD: the channel waits for a
    /// Resync).
    AccessLost { len: Option<usize>, psn: u32, to: A },
}

impl<A: Copy + PartialEq> Outbox<A> {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the next job is an ACK or NAK (a packet with nothing behind it).
    pub fn ack_next(&self) -> bool {
        matches!(self.jobs.front(), Some((_, RespJob::Ack { .. })))
    }

    /// Queues a response. A NAK the tail already holds for the same destination is not queued
    /// twice: it says nothing more, and a peer repeating a packet that is answered so (an RNR
    /// NAK for each retry of a Send that finds no WQE, an RD Resync's ACK) would otherwise
    /// grow the queue by one a packet while the link is busy.
    pub fn push(&mut self, to: A, job: RespJob) {
        if let (RespJob::Ack { psn, syndrome }, Some((t, RespJob::Ack { psn: p, syndrome: s }))) =
            (&job, self.jobs.back())
        {
            if *t == to && p == psn && s == syndrome {
                return;
            }
        }
        self.jobs.push_back((to, job));
    }

    /// Queues an ACK or NAK for `psn`; an ACK coalesces with an ACK to the same destination
    /// still queued at the tail (PKT-ACK-4), never past other jobs.
    pub fn push_ack(&mut self, to: A, psn: u32, syndrome: Syndrome) {
        if let Some((t, RespJob::Ack { psn: p, syndrome: s })) = self.jobs.back_mut() {
            if *t == to && s.is_ack() && syndrome.is_ack() {
                *p = psn;
                return;
            }
        }
        self.jobs.push_back((to, RespJob::Ack { psn, syndrome }));
    }

    /// Drops every queued response (the owner went to Error): Reads and Atomics owed are no
    /// longer pending.
    pub fn clear(&mut self) {
        self.jobs.clear();
        self.ack_waited = 0; // it counted for an ACK now gone
        for r in &mut self.resources {
            r.pending = false;
        }
    }

    /// Drops everything, the resources kept for replay included (Reset).
    pub fn reset(&mut self) {
        *self = Outbox::default();
    }

    /// Reads and Atomics accepted and not yet answered, against the inbound depth (ERR-RQ-6).
    pub fn has_room(&self, depth: u8) -> bool {
        self.resources.iter().filter(|r| r.pending).count() < depth as usize
    }

    /// Keeps at most `depth` Read entries and `depth` Atomic entries: a new one takes the
    /// oldest answered slot of its kind, so that the inbound-depth most recent Atomic results
    /// outlive later Reads (PKT-DUP-5) and the Reads' later Atomics.
    fn add_resource(&mut self, depth: u8, res: Resource) {
        let atomic = |r: &Resource| matches!(r.kind, ResourceKind::Atomic { .. } | ResourceKind::AtomicWrite);
        let kind = atomic(&res);
        if self.resources.iter().filter(|r| atomic(r) == kind).count() >= (depth as usize).max(1) {
            if let Some(i) = self.resources.iter().position(|r| atomic(r) == kind && !r.pending) {
                self.resources.remove(i);
            }
        }
        self.resources.push_back(res);
    }

    fn resource_done(&mut self, psn: u32) {
        if let Some(r) = self.resources.iter_mut().find(|r| r.psn == psn && r.pending) {
            r.pending = false;
        }
    }

    /// An inbound RDMA Read request for `t`, executed (one executor for RC and RD): its grant
    /// is checked now (ERR-RQ-9), its responses are queued, and a resource keeps it for a
    /// duplicate. The caller has checked the inbound depth (ERR-RQ-6). Returns the PSNs its
    /// responses use (PKT-PSN-3).
    pub fn read(&mut self, t: &Inbound<'_, A>, r: &Request<'_>, mtu: u64) -> Result<u32, Refusal> {
        let ReadPlan { grant, va, rkey, len, npkts } = begin_read(t.dev, t.pd, t.qpn, r, mtu)?;
        let psn = r.psn.value();
        let kind = ResourceKind::Read { va, rkey, len, npkts, mtu };
        self.add_resource(t.depth, Resource { qpn: t.qpn, psn, kind, pending: true });
        self.push(t.to, RespJob::ReadResp { grant, first_psn: psn, npkts, next: 0, len, mtu });
        Ok(npkts)
    }

    /// An inbound Atomic for `t`, executed (one executor for RC and RD); its result is queued
    /// and kept for a duplicate (PKT-DUP-4). The caller has checked the inbound depth
    /// (ERR-RQ-6).
    pub fn atomic(&mut self, t: &Inbound<'_, A>, r: &Request<'_>) -> Result<(), Refusal> {
        let orig = run_atomic(t.dev, t.pd, t.qpn, r)?;
        let psn = r.psn.value();
        self.add_resource(t.depth, Resource { qpn: t.qpn, psn, kind: ResourceKind::Atomic { orig }, pending: true });
        self.push(t.to, RespJob::AtomicAck { psn, orig });
        Ok(())
    }

    /// An inbound Atomic Write for `t`, executed (`run_atomic_write`); its answer is queued,
    /// and a resource keeps it for a duplicate, which is answered again and never executed
    /// again (as an Atomic, PKT-DUP-4). The caller has checked the inbound depth (ERR-RQ-6).
    pub fn atomic_write(&mut self, t: &Inbound<'_, A>, r: &Request<'_>) -> Result<(), Refusal> {
        run_atomic_write(t.dev, t.pd, t.qpn, r)?;
        let psn = r.psn.value();
        self.add_resource(t.depth, Resource { qpn: t.qpn, psn, kind: ResourceKind::AtomicWrite, pending: true });
        self.push(t.to, atomic_write_answer(psn));
        Ok(())
    }

    /// A duplicate request for `t` (PKT-DUP-1..6): never executed again, it
    /// never moves ePSN. A Send or Write is acknowledged again (`last_psn` is the last PSN
    /// accepted); a Read is answered again from the PSN it names, if a resource still
    /// holds it and the rest of its RETH matches (PKT-DUP-3); an Atomic gets its saved result
    /// (PKT-DUP-4, ERR-RQ-14). False when it is dropped: nothing holds it, or `depth` Read and
    /// Atomic responses are queued already (a peer cannot grow the queue by repeating one).
    pub fn duplicate(&mut self, t: &Inbound<'_, A>, r: &Request<'_>, last_psn: u32) -> bool {
        let Inbound { to, dev, pd, qpn, depth } = *t;
        let queued = self.jobs.iter().filter(|(_, j)| !matches!(j, RespJob::Ack { .. })).count();
        match r.operation {
            Operation::Send | Operation::RdmaWrite => {
                // Whether or not it asks (PKT-DUP-1): its sender is going back and waits for
                // word of how far the responder got. A run of them shares one ACK at the tail.
                self.push_ack(to, last_psn, Syndrome::ACK_NO_CREDITS);
                true
            }
            _ if queued >= (depth as usize).max(1) => false,
            Operation::RdmaReadRequest => {
                let Some(reth) = r.reth else { return false };
                let found = self.resources.iter().find_map(|res| match res.kind {
                    ResourceKind::Read { va, rkey, len, npkts, mtu } if res.qpn == qpn => {
                        let first = Psn::new(res.psn);
                        let k = r.psn.distance_from(first) as u64;
                        let inside = r.psn.in_range(first, first.add(npkts - 1))
                            && rkey == reth.r_key
                            && read_rest_matches(va, len, mtu, k, reth.va, reth.dma_length);
                        inside.then_some((va, rkey, len, npkts, res.psn, k, mtu))
                    }
                    _ => None,
                });
                let Some((va, rkey, len, npkts, first_psn, k, mtu)) = found else { return false };
                let grant = match len {
                    0 => None,
                    _ => match Grant::new(dev, rkey, pd, qpn, va, len, crate::types::Access::REMOTE_READ) {
                        Some(g) => Some(g),
                        None => return false,
                    },
                };
                self.push(to, RespJob::ReadResp { grant, first_psn, npkts, next: k as u32, len, mtu });
                true
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let psn = r.psn.value();
                let orig = self.resources.iter().find_map(|res| match res.kind {
                    ResourceKind::Atomic { orig } if res.psn == psn && res.qpn == qpn => Some(orig),
                    _ => None,
                });
                match orig {
                    Some(orig) => {
                        self.push(to, RespJob::AtomicAck { psn, orig });
                        true
                    }
                    None => false,
                }
            }
            Operation::AtomicWrite => {
                let psn = r.psn.value();
                let kept = self
                    .resources
                    .iter()
                    .any(|res| matches!(res.kind, ResourceKind::AtomicWrite) && res.psn == psn && res.qpn == qpn);
                if kept {
                    self.push(to, atomic_write_answer(psn));
                }
                kept
            }
            _ => false,
        }
    }

    /// Whether the next packet should be a response: responses go first, but not for ever, so
    /// that a channel answering a steady stream of requests still gets its own requests out.
    pub fn response_first(&self) -> bool {
        self.streak < RESPONSE_BURST
    }

    /// Whether the owner's requests may go before the head response: a plain ACK waits behind
    /// up to [`ACK_WAIT`] request packets.
    pub fn ack_may_wait(&self) -> bool {
        self.ack_waited < ACK_WAIT
            && matches!(self.jobs.front(), Some((_, RespJob::Ack { syndrome, .. })) if syndrome.is_ack())
    }

    /// A request packet went while the head ACK waited.
    pub fn ack_waits(&mut self) {
        self.ack_waited += 1;
    }

    /// Counts the packet the owner's turn sent.
    pub fn took_turn(&mut self, response: bool, after_request_declined: bool) {
        if response {
            self.ack_waited = 0;
        }
        self.streak = match (response, after_request_declined) {
            (false, _) => 0,
            (true, false) => self.streak.saturating_add(1),
            (true, true) => 1,
        };
    }

    /// Takes the head job if it is an ACK or NAK, as its PSN and AETH (an ACK syndrome
    /// becomes `ack`, as in [`send_next`](Self::send_next)): for an owner that writes such
    /// packets from a template (`wire::AckTemplate`). `None`, and nothing taken, otherwise.
    pub fn take_ack(&mut self, ack: Syndrome, msn: u32) -> Option<(A, Psn, AethRepr)> {
        let &(to, RespJob::Ack { psn, syndrome }) = self.jobs.front()? else { return None };
        self.jobs.pop_front();
        Some((to, Psn::new(psn), aeth_for(syndrome, ack, msn)))
    }

    /// Emits the head job's next packet for a channel of `service`: the BTH and AETH from the
    /// job (the opcode looked up by what it means; an ACK syndrome becomes `ack`, which
    /// carries the owner's credits), then `emit(to, packet, payload length, fill)` adds what
    /// the service adds and writes it. The job then advances or leaves the queue, freeing its
    /// resource with its last response. `None` with nothing queued.
    pub fn send_next(
        &mut self,
        service: ServiceType,
        dev: &dyn Hca,
        bth: impl Fn(Opcode, A, Psn) -> BthRepr,
        ack: Syndrome,
        msn: u32,
        emit: impl FnOnce(A, PacketRepr<'static>, usize, &dyn Fn(&mut Payload<'_>) -> bool) -> Option<usize>,
    ) -> Option<Sent<A>> {
        let aeth = |s: Syndrome| Some(aeth_for(s, ack, msn));
        let op = |operation, position| Opcode::lookup(service, operation, position, Suffix::Plain);
        let (to, job) = self.jobs.front_mut()?;
        let to = *to;
        let sent = match job {
            &mut RespJob::Ack { psn, syndrome } => {
                self.jobs.pop_front();
                let mut p = PacketRepr::new(bth(op(Operation::Acknowledge, Position::Only)?, to, Psn::new(psn)));
                p.aeth = aeth(syndrome);
                Sent::Packet(emit(to, p, 0, &|_| true))
            }
            &mut RespJob::AtomicAck { psn, orig } => {
                self.jobs.pop_front();
                self.resource_done(psn);
                let opcode = op(Operation::AtomicAcknowledge, Position::Only)?;
                let mut p = PacketRepr::new(bth(opcode, to, Psn::new(psn)));
                p.aeth = aeth(Syndrome::ACK_NO_CREDITS);
                p.atomic_ack_eth = Some(AtomicAckEthRepr { orig_remote_data: orig });
                Sent::Packet(emit(to, p, 0, &|_| true))
            }
            RespJob::ReadResp { grant, first_psn, npkts, next, len, mtu } => {
                let (first_psn, npkts, k, len, mtu) = (*first_psn, *npkts, *next, *len, *mtu);
                let position = read_response_position(npkts, k);
                let offset = k as u64 * mtu;
                let payload = (len - offset.min(len)).min(mtu) as usize;
                let psn = Psn::new(first_psn).add(k); // PKT-PSN-7
                let mut p = PacketRepr::new(bth(op(Operation::RdmaReadResponse, position)?, to, psn));
                if position != Position::Middle {
                    p.aeth = aeth(Syndrome::ACK_NO_CREDITS); // PKT-ACK-10
                }
                // The bytes are read now, through a grant that checks its key again if one was
                // revoked since the request (see `Grant`).
                // A page of on-demand memory that is not there is as a key revoked: the bytes
                // cannot be sent (an HCA's unserved page fault).
                let sent = match grant {
                    None => emit(to, p, payload, &|out| out.remaining() == 0),
                    Some(g) => match g.bytes(dev, offset, payload as u64).filter(|(m, at)| m.readable(*at, payload)) {
                        Some((m, at)) => emit(to, p, payload, &|out| out.read(m, at, payload)),
                        None => {
                            self.jobs.pop_front();
                            self.resource_done(first_psn);
                            // In place of this response, with its PSN: the Read's own PSN,
                            // acknowledged by the responses before, would be outside what the
                            // requester still waits for (PKT-ACK-8) and dropped.
                            let syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
                            let mut p = PacketRepr::new(bth(op(Operation::Acknowledge, Position::Only)?, to, psn));
                            p.aeth = aeth(syndrome);
                            return Some(Sent::AccessLost { len: emit(to, p, 0, &|_| true), psn: psn.value(), to });
                        }
                    },
                };
                if k + 1 >= npkts {
                    self.jobs.pop_front();
                    self.resource_done(first_psn);
                } else if let Some((_, RespJob::ReadResp { next, .. })) = self.jobs.front_mut() {
                    *next += 1;
                }
                Sent::Packet(sent)
            }
        };
        Some(sent)
    }
}

/// The AETH of a response with `syndrome`: an ACK carries `ack`, the owner's credits.
fn aeth_for(syndrome: Syndrome, ack: Syndrome, msn: u32) -> AethRepr {
    AethRepr { syndrome: if syndrome.is_ack() { ack } else { syndrome }, msn }
}

/// Where response `k` of `n` sits in a Read's response message.
pub(crate) fn read_response_position(n: u32, k: u32) -> Position {
    match (n, k) {
        (1, _) => Position::Only,
        (_, 0) => Position::First,
        (n, k) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// The completion status a NAK gives the WQE it names (PKT-NAK-2, ERR-SQ-6..9).
pub(crate) fn nak_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
        NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
        NakCode::PsnSeqErr => WcStatus::RetryExcErr,
    }
}

/// Read response `k` of a Read of `length` bytes in `n` responses at `mtu`, taken in: its
/// position must be the one expected (else Bad Response), its payload exactly the bytes due
/// (ERR-SQ-13), and they are scattered into `local`. One place for RC and RD.
pub(crate) fn take_read_response(
    local: &[MemRef],
    length: u64,
    n: u32,
    k: u32,
    mtu: u64,
    position: Position,
    payload: &[u8],
) -> Result<(), WcStatus> {
    let offset = k as u64 * mtu;
    let want_len = (length - offset.min(length)).min(mtu);
    let starts = |p: Position| matches!(p, Position::First | Position::Only);
    let ends = |p: Position| matches!(p, Position::Last | Position::Only);
    let want = read_response_position(n, k);
    if starts(position) != starts(want) {
        return Err(WcStatus::BadRespErr); // a start mid-Read, or none at its start: ERR-SQ-12
    }
    // Ending before the last response, or not at it: less or more data than asked, as a wrong
    // length is (ERR-SQ-13).
    if ends(position) != ends(want) || payload.len() as u64 != want_len {
        return Err(WcStatus::LocLenErr);
    }
    scatter(local, offset, payload).map_err(|_| WcStatus::LocProtErr)
}

/// An Atomic ACK's original value, written to the WQE's one 8-byte local buffer (WR-ATOM-3).
pub(crate) fn take_atomic_ack(local: &[MemRef], orig: u64) -> WcStatus {
    match local.first() {
        Some(m) => m.write(0, &orig.to_ne_bytes()).map_or(WcStatus::LocProtErr, |_| WcStatus::Success),
        None => WcStatus::LocProtErr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::NakCode;

    /// The same NAK to the same destination is queued once while it waits at the tail (a peer
    /// retrying into an RNR NAK adds nothing); another NAK, another PSN or another
    /// destination is queued.
    #[test]
    fn a_repeated_nak_is_queued_once() {
        let mut out: Outbox<u32> = Outbox::default();
        let rnr = Syndrome::RnrNak { timer_code: 1 };
        for _ in 0..1000 {
            out.push(1, RespJob::Ack { psn: 5, syndrome: rnr });
        }
        assert_eq!(out.len(), 1);
        out.push(2, RespJob::Ack { psn: 5, syndrome: rnr });
        out.push(2, RespJob::Ack { psn: 6, syndrome: rnr });
        out.push(2, RespJob::Ack { psn: 6, syndrome: Syndrome::Nak(NakCode::InvalidRequest) });
        out.push(2, RespJob::Ack { psn: 6, syndrome: Syndrome::Nak(NakCode::InvalidRequest) });
        assert_eq!(out.len(), 4);
    }

    /// A plain ACK at the head may wait behind ACK_WAIT request packets, then not until a
    /// response has gone; a NAK (or RNR NAK) never waits, nor does a queue with none.
    #[test]
    fn only_a_plain_ack_waits_and_only_for_so_many_requests() {
        let mut out: Outbox<()> = Outbox::default();
        assert!(!out.ack_may_wait(), "nothing queued");
        out.push_ack((), 5, Syndrome::ACK_NO_CREDITS);
        for _ in 0..ACK_WAIT {
            assert!(out.ack_may_wait());
            out.ack_waits();
            out.took_turn(false, false);
        }
        assert!(!out.ack_may_wait(), "waited long enough");
        out.took_turn(true, false); // the ACK went
        assert!(out.ack_may_wait(), "the next ACK waits afresh");
        out.ack_waits();
        out.clear(); // the QP went to Error: the count went with the ACK it was for
        out.push_ack((), 6, Syndrome::ACK_NO_CREDITS);
        for _ in 0..ACK_WAIT {
            assert!(out.ack_may_wait(), "a fresh ACK waits its whole count");
            out.ack_waits();
        }
        for syndrome in [Syndrome::Nak(NakCode::PsnSeqErr), Syndrome::RnrNak { timer_code: 3 }] {
            let mut out: Outbox<()> = Outbox::default();
            out.push_ack((), 5, syndrome);
            assert!(!out.ack_may_wait(), "{syndrome:?}");
        }
    }
}
