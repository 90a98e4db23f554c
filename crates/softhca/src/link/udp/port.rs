//! The UDP link's [`Port`] for the engine driver (`link::driver`): the I/O state of
//! [`super::batch`] plus the receive and transmit batches, and one turn over them.

use super::batch::{bump, Io, RxFrom, TxBufs};
use super::*;
use crate::link::driver::Port;

/// Everything one engine turn needs, behind the driver's lock.
pub(super) struct UdpPort {
    pub(super) io: Io,
    pub(super) rx: sys::RxBatch,
    pub(super) msgs: Vec<sys::RxMsg>,
    pub(super) tx: TxBufs,
    /// Where delivery of the received batch resumes (message, byte offset in it), when an
    /// inline turn left its tail for the next turn.
    pub(super) resume: Option<(usize, usize)>,
    /// The multicast groups' sockets a turn reads (see `groups`), kept to reuse its room.
    pub(super) group_socks: Vec<(std::net::IpAddr, Arc<UdpSocket>)>,
}

/// Hands the received batch to the device from `at`, on the engine clock (the poller's `now`
/// in an inline turn, a fresh reading otherwise); returns where delivery stopped (see
/// [`Io::deliver_batch`]) and the clock after it.
fn take_in(
    io: &mut Io,
    rx: &mut sys::RxBatch,
    msgs: &[sys::RxMsg],
    tx: &mut TxBufs,
    at: (usize, usize),
    inline: bool,
    now: u64,
) -> (Option<(usize, usize)>, u64) {
    io.clock = if inline { now } else { io.now() };
    let stopped = io.deliver_batch(rx, msgs, tx, at, inline);
    (stopped, io.clock)
}

impl Port for UdpPort {
    /// One turn. On the engine thread: receive a batch (flushing the transmit side every
    /// [`FLUSH_EVERY`](super::batch::FLUSH_EVERY) datagrams), run expired timers, transmit.
    /// Inline (a poller's turn, which the driver starts with a flush or not): receive and run
    /// timers, and leave what they produced (ACKs, responses, retransmissions) for the next
    /// poll or post, so that an ACK and the reply the application posts on seeing its
    /// completion leave in one `sendmmsg`; ACKs received behind a request wait for the next
    /// turn too (see [`Io::deliver_batch`]).
    fn turn(&mut self, inline: bool, mut now: u64) -> bool {
        let UdpPort { io, rx, msgs, tx, resume, group_socks } = self;
        io.follow_ud_qps();
        let mut worked = false;
        if let Some(at) = resume.take() {
            // The rest of the last batch, held back by an inline turn (see `deliver_batch`).
            worked = true;
            (*resume, now) = take_in(io, rx, msgs, tx, at, inline, now);
        } else {
            // Responses first while they are steered apart: the ACKs and read responses queued
            // beside a flood of requests are what lets this device's own requests complete
            // (see `Io::responses`). Only responses are there, so delivery never stops early.
            // The engine thread reads the queue on every turn (it sleeps on both sockets).
            if let Some(fd) = io.responses.as_ref().map(|r| r.as_raw_fd()) {
                if io.steering || io.draining || !inline {
                    // The queue is the device address's (a socket of its 4791 group): said
                    // before the read, as the last turn may have ended on another address's.
                    io.rx_from = RxFrom::Device;
                    match rx.recv(fd, msgs, BATCH) {
                        Ok(n @ 1..) => {
                            worked = true;
                            bump(&io.stats.rx_syscalls, 1);
                            bump(&io.stats.rx_response_queue, n as u64);
                            (*resume, now) = take_in(io, rx, msgs, tx, (0, 0), inline, now);
                        }
                        _ => io.draining = false,
                    }
                }
            }
            if resume.is_none() {
                io.rx_from = RxFrom::Device;
                let rx_fd = io.raw.as_ref().map_or(io.sock.as_raw_fd(), |r| r.as_raw_fd());
                // After a receive that found nothing or a lone datagram, ask for one message:
                // a lone datagram (or a GRO buffer) is the common case then, and a larger vlen
                // costs a second, failing dequeue in the kernel (≈ 0.3 µs) before the data
                // reaches the device. A single message received, or several, restores the batch.
                let max = if io.rx_idle { 1 } else { BATCH };
                let got = rx.recv(rx_fd, msgs, max);
                io.rx_idle = !matches!(got, Ok(n) if n >= 2 || n == max);
                match got {
                    Ok(n) if n > 0 => {
                        worked = true;
                        bump(&io.stats.rx_syscalls, 1);
                        (*resume, now) = take_in(io, rx, msgs, tx, (0, 0), inline, now);
                        io.steer(Some(n == BATCH));
                    }
                    Ok(_) if io.steering => {
                        io.clock = if inline { now } else { io.now() };
                        io.steer(None);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "recvmmsg failed"),
                }
            }
            // The alternate address (a device with one has QPs that migrate to it), after
            // the first: its traffic is the exception.
            if resume.is_none() {
                if let Some(fd) = io.alt.as_ref().map(|a| a.sock.as_raw_fd()) {
                    if let Ok(1..) = rx.recv(fd, msgs, BATCH) {
                        worked = true;
                        bump(&io.stats.rx_syscalls, 1);
                        io.rx_from = RxFrom::Alt;
                        (*resume, now) = take_in(io, rx, msgs, tx, (0, 0), inline, now);
                    }
                }
            }
            // The multicast groups' sockets, while there are any (see `groups`). Taken out
            // of the list first: an attach or detach holds the device's group table and then
            // the list, and delivery takes that table.
            if resume.is_none() && io.groups.any() {
                io.groups.snapshot(group_socks);
                for (addr, s) in group_socks.drain(..) {
                    if resume.is_some() {
                        continue;
                    }
                    if let Ok(1..) = rx.recv(s.as_raw_fd(), msgs, BATCH) {
                        worked = true;
                        bump(&io.stats.rx_syscalls, 1);
                        io.rx_from = RxFrom::Group(addr);
                        (*resume, now) = take_in(io, rx, msgs, tx, (0, 0), inline, now);
                    }
                }
            }
        }
        worked |= io.receive_frames(tx);
        if io.ctx.poll_timeout().is_some_and(|t| t <= now) {
            io.ctx.handle_timeout(now);
        }
        if inline {
            worked
        } else {
            io.flush_tx(tx, now) || worked
        }
    }

    fn holds_acks(&self) -> bool {
        true
    }

    /// The rest of the last batch, if an inline turn held some back; no receive (a system
    /// call, most often for nothing: the peer waits for this side's answer).
    fn held_turn(&mut self, now: u64) -> bool {
        let UdpPort { io, rx, msgs, tx, resume, .. } = self;
        let Some(at) = resume.take() else { return false };
        (*resume, _) = take_in(io, rx, msgs, tx, at, true, now);
        true
    }

    fn flush(&mut self, now: u64) -> bool {
        self.io.flush_tx(&mut self.tx, now)
    }

    /// The engine thread's turn standing in for a program that spins on memory: a poller's
    /// turn (receive and timers, the rest of a batch held back as there), whose ACKs are left
    /// for the program's next post. A program that answers the Write it waited for with one
    /// of its own sends both in one `sendmmsg`, and its peer, polling for that ACK, takes the
    /// Write in with it: sent alone, the ACK completed the peer's Write and the peer's program
    /// turned to memory before its Write arrived, and every round needed an engine thread to
    /// stand in (perftest's `ib_write_lat` 8 B over UDP stuck at 30-35 µs typical a round in
    /// one run of three, against 4.4). What is left waits for the driver's hold at most.
    fn stand_in(&mut self, now: u64) -> (bool, bool) {
        let worked = self.turn(true, now);
        if worked && self.io.ctx.may_transmit() {
            return (true, true);
        }
        (self.flush(now) || worked, false)
    }

    fn leftovers(&self) -> bool {
        self.resume.is_some() || self.io.tx_backlog
    }

    fn rx_fd(&self) -> RawFd {
        self.io.groups.poll_fd()
    }

    fn close(&mut self) {
        self.io.taps.flush();
    }
}
