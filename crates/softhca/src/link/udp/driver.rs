//! The engine driver: the engine thread, the doorbell, busy-poll turns run inline by the
//! application's threads, and the sleep in `ppoll` (see "The engine" in the module docs of
//! [`super`]). It owns the [`Engine`] (the I/O state of [`super::batch`] plus the receive and
//! transmit batches) behind a mutex inline callers only `try_lock`.

use super::batch::{bump, Io, TxBufs};
use super::*;

/// Flags shared by the engine thread, the doorbell and inline callers.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    /// The engine thread is (about to be) asleep in `ppoll`.
    pub(super) sleeping: AtomicBool,
    /// Until when it sleeps (ns since the epoch); 0 while it is still deciding.
    pub(super) sleep_until: AtomicU64,
    /// Doorbells rung (posts, Modify QP).
    pub(super) rings: AtomicU64,
    /// When an application thread last ran a whole engine turn inline (busy-poll), ns since
    /// the epoch; 0: never.
    pub(super) last_inline: AtomicU64,
    /// The doorbell count the last transmit flush covered. With `owed`, only a hint for the
    /// napping engine thread (a stale value costs it one needless flush), so both are written
    /// Relaxed on the poller's hot path.
    pub(super) rings_flushed: AtomicU64,
    /// An inline turn took packets in after its flush: what they produced (ACKs) waits for
    /// the next turn.
    pub(super) owed: AtomicBool,
}

/// What the engine thread, the doorbell and the progress hook share. The engine's state is
/// behind a mutex that inline callers only ever `try_lock`, so a poller never waits for
/// another thread's turn; work rung in meanwhile is picked up by whoever holds it (see
/// [`Link::drive_inline`]).
pub(super) struct Link {
    pub(super) ctx: Context,
    pub(super) busy: bool,
    pub(super) epoch: Instant,
    pub(super) shared: Shared,
    pub(super) stats: Arc<Stats>,
    pub(super) efd: OwnedFd,
    /// The fd the engine receives on (the 4791 socket or the raw socket, owned by the engine).
    pub(super) rx_fd: RawFd,
    pub(super) engine: Mutex<Engine>,
}

/// Everything one engine turn needs, behind [`Link::engine`].
pub(super) struct Engine {
    pub(super) io: Io,
    pub(super) rx: sys::RxBatch,
    pub(super) msgs: Vec<sys::RxMsg>,
    pub(super) tx: TxBufs,
    /// Where delivery of the received batch resumes (message, byte offset in it), when an
    /// inline turn left its tail for the next turn.
    pub(super) resume: Option<(usize, usize)>,
}

/// Adds to a counter written outside the engine's lock (doorbells, sleeps).
pub(super) fn bump_shared(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// While an application thread ran a turn inline within this long, the busy-poll engine
/// thread naps instead of competing with it for the socket and the core.
pub(super) const INLINE_GRACE: Duration = Duration::from_millis(10);
/// A doorbell leaves its transmit work to the poller if it polled this recently (busy-poll).
pub(super) const DOORBELL_DEFER: Duration = Duration::from_micros(50);
/// While a poller drives the engine, the engine thread looks this often for a doorbell left
/// to a poller that has stopped since.
pub(super) const DEFERRED_CHECK: Duration = Duration::from_millis(1);
/// The engine thread wakes at least this often even with no deadline, so that a deadline an
/// inline transmit sets later than this needs no wake-up call.
pub(super) const IDLE_WAKE: Duration = Duration::from_millis(50);

impl Link {
    pub(super) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(super) fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn try_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Runs the engine on the calling thread unless another thread is running it: a whole
    /// turn (`full`: the progress hook, busy-poll) or the transmit side only (the doorbell).
    /// A doorbell rung while another thread held the engine is honoured by that thread when it
    /// lets go: it rechecks the ring count after unlocking (the ringer counts before trying).
    /// Returns whether it left work behind (more to transmit than one flush sends, or the rest
    /// of a receive batch), which a sleeping engine thread must be woken for.
    pub(super) fn drive_inline(&self, mut full: bool) -> bool {
        loop {
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let left = {
                let Some(mut e) = self.try_engine() else { return false };
                let now = self.now();
                if full {
                    self.shared.last_inline.store(now.max(1), Ordering::Relaxed);
                    let worked = e.turn(true, now);
                    self.shared.owed.store(worked, Ordering::Relaxed);
                } else {
                    e.flush_tx(now);
                    self.shared.owed.store(false, Ordering::Relaxed);
                }
                self.shared.rings_flushed.store(seen, Ordering::Relaxed);
                e.resume.is_some() || e.io.tx_backlog
            };
            if self.shared.rings.load(Ordering::SeqCst) == seen {
                return left;
            }
            full = false;
        }
    }

    /// Wakes the engine thread if it sleeps, for work an application thread left it.
    pub(super) fn wake_for_leftovers(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) {
            bump_shared(&self.stats.doorbells, 1);
            sys::eventfd_signal(self.efd.as_raw_fd());
        }
    }

    /// The doorbell: transmit inline, then wake the engine thread only if it sleeps past a
    /// deadline that the new work set.
    pub(super) fn ring(&self) {
        self.shared.rings.fetch_add(1, Ordering::SeqCst);
        if self.poller_spinning() {
            // The poller's next turn starts by transmitting: leave the work to it, so that
            // several posts (and a pending ACK) go out in one batch.
            return;
        }
        if self.drive_inline(false) {
            self.wake_for_leftovers(); // more than one flush sends: the engine thread goes on
            return;
        }
        if self.shared.sleeping.load(Ordering::SeqCst) {
            let until = self.shared.sleep_until.load(Ordering::SeqCst);
            if until == 0 || self.ctx.poll_timeout().is_some_and(|t| t < until) {
                bump_shared(&self.stats.doorbells, 1);
                sys::eventfd_signal(self.efd.as_raw_fd());
            }
        }
    }

    /// Whether a poller ran a turn within [`DOORBELL_DEFER`] (it is spinning on its CQ).
    pub(super) fn poller_spinning(&self) -> bool {
        let last = self.shared.last_inline.load(Ordering::Relaxed);
        self.busy && last != 0 && self.now().saturating_sub(last) < DOORBELL_DEFER.as_nanos() as u64
    }

    /// Whether an application thread is driving the engine inline (busy-poll).
    pub(super) fn inline_active(&self, now: u64) -> Option<Duration> {
        let last = self.shared.last_inline.load(Ordering::Relaxed);
        let idle = Duration::from_nanos(now.saturating_sub(last));
        (self.busy && last != 0 && idle < INLINE_GRACE).then(|| INLINE_GRACE - idle)
    }

    /// The engine thread. In blocking mode it runs every turn and sleeps in `ppoll` (socket,
    /// doorbell eventfd, next deadline) when idle. In busy-poll mode it does the same only
    /// while no application thread polls; while one does, it naps and leaves the socket, the
    /// timers and the core to the poller.
    pub(super) fn background(self: Arc<Self>) {
        while !self.shared.stop.load(Ordering::Acquire) {
            if let Some(nap) = self.inline_active(self.now()) {
                // A doorbell left to a poller that stopped polling right after it (the
                // application posted its last request and went to sleep), or ACKs its last
                // turn left for the next, are flushed here.
                let deferred = self.shared.rings.load(Ordering::SeqCst)
                    != self.shared.rings_flushed.load(Ordering::Relaxed)
                    || self.shared.owed.load(Ordering::Relaxed);
                if deferred && !self.poller_spinning() && self.drive_inline(false) {
                    continue;
                }
                std::thread::sleep(nap.min(DEFERRED_CHECK).max(Duration::from_micros(200)));
                continue;
            }
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let worked = if self.busy {
                match self.try_engine() {
                    Some(mut e) => e.turn(false, self.now()),
                    None => {
                        std::thread::yield_now();
                        continue;
                    }
                }
            } else {
                self.lock_engine().turn(false, self.now())
            };
            self.shared.rings_flushed.store(seen, Ordering::Relaxed);
            if worked {
                continue;
            }
            // Sleep until the socket, the doorbell or the next deadline (Dekker-style with
            // `ring`: flag first, then recheck the ring count).
            self.shared.sleep_until.store(0, Ordering::SeqCst);
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if self.shared.rings.load(Ordering::SeqCst) != seen || self.shared.stop.load(Ordering::SeqCst) {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let now = self.now();
            let until = self.ctx.poll_timeout().unwrap_or(u64::MAX).min(now + IDLE_WAKE.as_nanos() as u64).max(1);
            self.shared.sleep_until.store(until, Ordering::SeqCst);
            let mut fds = [
                libc::pollfd { fd: self.rx_fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.efd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            bump_shared(&self.stats.sleeps, 1);
            if let Err(e) = sys::ppoll(&mut fds, Some(Duration::from_nanos(until.saturating_sub(now)))) {
                tracing::warn!(error = %e, "ppoll failed");
            }
            self.shared.sleeping.store(false, Ordering::SeqCst);
            if fds[1].revents != 0 {
                sys::eventfd_drain(self.efd.as_raw_fd());
            }
        }
        if let Some(p) = self.lock_engine().io.pcap.as_mut() {
            let _ = p.flush();
        }
    }
}

impl Engine {
    /// One turn. On the engine thread: receive a batch (flushing the transmit side every
    /// [`FLUSH_EVERY`](super::batch::FLUSH_EVERY) datagrams), run expired timers, transmit. Inline (a poller's turn):
    /// transmit first, then receive and run timers, and leave what they produced (ACKs,
    /// responses, retransmissions) for the next poll or post, so that an ACK and the reply
    /// the application posts on seeing its completion leave in one `sendmmsg`; ACKs received
    /// behind a request wait for the next turn too (see [`Io::deliver_batch`]). Returns
    /// whether anything happened.
    pub(super) fn turn(&mut self, inline: bool, mut now: u64) -> bool {
        let Engine { io, rx, msgs, tx, resume } = self;
        let mut worked = inline && io.flush_tx(tx, now);
        if let Some(at) = resume.take() {
            // The rest of the last batch, held back by an inline turn (see `deliver_batch`).
            worked = true;
            io.clock = if inline { now } else { io.now() };
            *resume = io.deliver_batch(rx, msgs, tx, at, inline);
            now = io.clock;
        } else {
            let rx_fd = io.raw.as_ref().map_or(io.sock.as_raw_fd(), |r| r.as_raw_fd());
            // After a receive that found nothing or a lone datagram, ask for one message: a
            // lone datagram (or a GRO buffer) is the common case then, and a larger vlen costs
            // a second, failing dequeue in the kernel (≈ 0.3 µs) before the data reaches the
            // device. A single message received, or several, restores the batch.
            let max = if io.rx_idle { 1 } else { BATCH };
            let got = rx.recv(rx_fd, msgs, max);
            io.rx_idle = !matches!(got, Ok(n) if n >= 2 || n == max);
            match got {
                Ok(n) if n > 0 => {
                    worked = true;
                    bump(&io.stats.rx_syscalls, 1);
                    io.clock = if inline { now } else { io.now() };
                    *resume = io.deliver_batch(rx, msgs, tx, (0, 0), inline);
                    now = io.clock;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "recvmmsg failed"),
            }
        }
        if io.ctx.poll_timeout().is_some_and(|t| t <= now) {
            io.ctx.handle_timeout(now);
        }
        if inline {
            worked
        } else {
            io.flush_tx(tx, now) || worked
        }
    }

    pub(super) fn flush_tx(&mut self, now: u64) -> bool {
        self.io.flush_tx(&mut self.tx, now)
    }
}
