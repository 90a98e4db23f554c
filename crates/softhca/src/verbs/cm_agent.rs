//! The connection manager on a device's QP1: a [`CmAgent`] owns the port's GSI (its own PD
//! resources and CQ), carries the MADs of a [`Cm`] state machine over it, and feeds it the
//! MADs that arrive, each with the sender's GID from the receive's GRH area. The consumer (or
//! a driver) calls [`CmAgent::progress`] with the clock the device runs on, and acts on the
//! events: on a REQ it creates and accepts, on Established it moves its QP to RTR and RTS.

use std::collections::{HashMap, VecDeque};

use super::ah::Ah;
use super::cq::{CompChannel, Cq};
use super::device::Context;
use super::error::Result;
use super::mr::Mr;
use super::pd::Pd;
use super::qp::{Qp, QpAttr, QpInitAttr};
use super::types::{Access, AhAttr, Gid, NotifyKind, QpState, SpecialQp, WcOpcode, WcStatus, GSI_QKEY, GSI_QPN};
use super::wr::{RecvWr, SendWr};
use crate::transport::cm::{Cm, Peer};
use crate::wire::mad::MAD_LEN;

/// Receive slots of the GSI, as many as Linux's MAD layer posts (ib_mad's `recv_queue_size`,
/// 512): a slot holds a 40-byte GRH area and one MAD. A burst of REQs (cmtime's 100
/// connections at once) larger than the slots lost the rest, and their requesters waited
/// out a CM response timeout (4.3 s) to send again.
const SLOTS: usize = 512;
const SLOT: usize = 40 + MAD_LEN;
/// The GSI's SQ depth, as Linux's (ib_mad's `send_queue_size`, 128). MADs go out inline,
/// copied at post time, so a send needs no buffer of its own; those that find the SQ full
/// wait in order for its completions, as Linux's MAD layer queues them (cmtime's 1,000
/// disconnects at once: dropped, they waited out a CM response timeout, 4.3 s, per 128).
const SEND_DEPTH: usize = 128;

/// The most address handles kept for the peers the CM answers. A send's WQE takes its own
/// copy of the address, so a handle may go right after its post; without a bound, one MAD
/// from each of 65,536 source addresses (a DREQ or a REQ for no listener is always answered)
/// took the device's every AH, the application's too.
const MAX_CACHED_AHS: usize = 64;

/// A port's connection manager on its GSI.
pub struct CmAgent {
    cm: Cm,
    pd: Pd,
    qp: Qp,
    cq: Cq,
    recv: Mr,
    /// Address handles of recent peers, at most [`MAX_CACHED_AHS`].
    ahs: HashMap<Peer, Ah>,
    /// MADs the GSI dropped: no AH for the peer, or a send refused.
    pub dropped: u64,
    /// MADs posted and not yet completed (each send is signaled: a driver that must not go
    /// before its last MADs left, a process exiting, waits for this to reach 0).
    in_flight: u64,
    /// MADs waiting for room in the SQ, in the order the CM queued them.
    waiting: VecDeque<(Peer, Box<[u8; MAD_LEN]>)>,
}

/// The sender's GID from a UD receive's GRH area: an IPv6 header, or (RoCEv2 over IPv4) 20
/// bytes of zeros and then the IPv4 header.
fn peer_of(grh: &[u8]) -> Option<Peer> {
    match (grh.first()? >> 4, grh.get(20)? >> 4) {
        (6, _) => grh.get(8..24)?.try_into().ok(),
        (0, 4) => {
            let a = grh.get(32..36)?;
            Some(Gid::from_ipv4([a[0], a[1], a[2], a[3]].into()).0)
        }
        _ => None,
    }
}

impl CmAgent {
    /// Takes the port's GSI on `pd` and readies it; `seed` varies the communication IDs.
    pub fn new(ctx: &Context, pd: &Pd, seed: u32) -> Result<CmAgent> {
        Self::with_channel(ctx, pd, seed, None)
    }

    /// As [`CmAgent::new`], its CQ reporting to `channel` once armed ([`CmAgent::arm`]): a
    /// driver thread waits on the channel's fd for MADs instead of polling.
    pub fn with_channel(ctx: &Context, pd: &Pd, seed: u32, channel: Option<&CompChannel>) -> Result<CmAgent> {
        let cq = ctx.create_cq_with_channel((SLOTS + SEND_DEPTH) as u32, channel)?;
        let init = QpInitAttr::ud(&cq, &cq)
            .max_send_wr(SEND_DEPTH as u32)
            .max_recv_wr(SLOTS as u32)
            .max_inline_data(MAD_LEN as u32);
        let qp = ctx.get_special_qp(pd, SpecialQp::Gsi, &init)?;
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(GSI_QKEY))?;
        qp.modify(&QpAttr::new(QpState::Rtr))?;
        qp.modify(&QpAttr::to_rts().sq_psn(0))?;
        let recv = pd.alloc_mr(SLOTS * SLOT, Access::LOCAL_WRITE)?;
        for i in 0..SLOTS {
            qp.post_recv(&[RecvWr::new(i as u64, &[recv.sge(i * SLOT..(i + 1) * SLOT)])]).map_err(|e| e.error)?;
        }
        Ok(CmAgent {
            cm: Cm::new(seed),
            pd: pd.clone(),
            qp,
            cq,
            recv,
            ahs: HashMap::new(),
            dropped: 0,
            in_flight: 0,
            waiting: VecDeque::new(),
        })
    }

    /// The state machine: listen, connect, accept, reject, disconnect, poll events.
    pub fn cm(&mut self) -> &mut Cm {
        &mut self.cm
    }

    /// Asks for the next completion of the GSI's CQ on its channel.
    pub fn arm(&self) -> Result<()> {
        self.cq.req_notify(NotifyKind::NextCompletion)
    }

    /// Takes in the MADs that arrived, runs the CM's timers at `now`, and sends what it
    /// queued.
    pub fn progress(&mut self, now: u64) -> Result<()> {
        self.receive(now)?;
        self.transmit();
        Ok(())
    }

    /// Takes in the MADs that arrived and runs the CM's timers at `now`. What the CM answers
    /// waits for [`CmAgent::transmit`]: a driver acts on the events first (a requester's QP
    /// reaches RTR before its RTU leaves).
    pub fn receive(&mut self, now: u64) -> Result<()> {
        let mut grh_mad = [0u8; SLOT];
        while let Some(wc) = self.cq.poll_one()? {
            if wc.opcode != WcOpcode::Recv {
                self.in_flight = self.in_flight.saturating_sub(1); // a MAD left (or failed)
                continue;
            }
            let slot = wc.wr_id as usize % SLOTS;
            let len = (wc.byte_len as usize).min(SLOT);
            if wc.status == WcStatus::Success && wc.src_qp == GSI_QPN && len >= 40 {
                self.recv.read(slot * SLOT, &mut grh_mad)?;
                if let Some(peer) = peer_of(&grh_mad[..40]) {
                    // A short MAD too: the CM drops and counts it.
                    self.cm.handle_mad(now, peer, &grh_mad[40..len]);
                }
            }
            if wc.status != WcStatus::WrFlushErr {
                let sge = self.recv.sge(slot * SLOT..(slot + 1) * SLOT);
                self.qp.post_recv(&[RecvWr::new(slot as u64, &[sge])]).map_err(|e| e.error)?;
            }
        }
        self.cm.handle_timeout(now);
        Ok(())
    }

    /// Sends the MADs the CM queued, those that waited for room first; what does not fit in
    /// the SQ waits for its completions (the next call after [`CmAgent::receive`] took them).
    pub fn transmit(&mut self) {
        while let Some(m) = self.cm.poll_transmit() {
            self.waiting.push_back(m);
        }
        while self.in_flight < SEND_DEPTH as u64 {
            let Some((peer, mad)) = self.waiting.pop_front() else { break };
            if !self.ahs.contains_key(&peer) {
                if self.ahs.len() >= MAX_CACHED_AHS {
                    for (_, ah) in self.ahs.drain() {
                        let _ = ah.destroy(); // its count back to the device (and its PD's hold)
                    }
                }
                let Ok(ah) = self.pd.create_ah(&AhAttr::roce(Gid(peer), 0)) else {
                    self.dropped += 1;
                    continue;
                };
                self.ahs.insert(peer, ah);
            }
            let ah = &self.ahs[&peer];
            if self.qp.post_send(&[SendWr::send_inline(0, &mad[..]).ud(ah, GSI_QPN, GSI_QKEY).signaled()]).is_err() {
                self.dropped += 1; // the QP in Error: the CM sends again at its deadline
            } else {
                self.in_flight += 1;
            }
        }
    }

    /// MADs not yet sent: posted on the GSI and not completed (on a link that defers datagram
    /// completions, not yet handed to the kernel), or waiting for room in its SQ.
    pub fn in_flight(&self) -> u64 {
        self.in_flight + self.waiting.len() as u64
    }

    /// The earliest CM deadline.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.cm.poll_timeout()
    }
}
