//! The engine driver any OS-facing link reuses: an engine thread per device, the doorbell,
//! busy-poll turns run inline by the application's threads, and the sleep in `ppoll`.
//!
//! A link supplies its I/O as a [`Port`] — one turn of receiving and delivering, the
//! transmit flush, the descriptor that becomes readable when datagrams arrive — and the
//! driver decides who runs it and when. The port sits behind a mutex that inline callers only
//! `try_lock`, so a poller never waits for another thread's turn; work rung in meanwhile is
//! picked up by whoever holds it (see [`Driver::drive_inline`]).
//!
//! In blocking mode the engine thread runs every turn and sleeps in `ppoll` (the port's
//! descriptor, the doorbell eventfd, the next deadline) when idle. In busy-poll mode the
//! application's CQ polls and posts run turns on their own thread; the engine thread stands in
//! while nobody spins on a CQ ([`POLL_WINDOW`]: a progress thread's occasional poll is no
//! spin), and naps while one does. A nap ends early when the poller has run no turn and
//! posted nothing for [`poller_quiet_ns`] (a program that spins on memory between its CQ polls,
//! waiting for a Write only its device can take in), and, on a link whose senders can see
//! the poller leave their datagrams untaken (shared memory), when one of them rings
//! ([`Port::napper`]); on a link whose descriptor is readable with any datagram (UDP), when
//! datagrams wait at the nap's end, or arrive during a watching nap, and the program, whose
//! last act was taking completions, does not come back for them ([`ReadyWatch`]). Its turns standing in may leave the ACKs they owe for the
//! program's next post ([`Port::stand_in`]). In both modes the engine thread keeps turning for
//! [`IDLE_SPIN`] after its last work (unless it stands in for a poller that spins on memory)
//! before it sleeps, so that a passive side (the target of Reads, whose program does not
//! poll) answers at a spinner's pace. A blocking device whose application spins on its CQ anyway
//! (perftest, the pingpongs, `softhca perf`: most RDMA programs poll) is driven the busy-poll
//! way while it spins: [`SPIN_POLLS`] polls in a row, each within [`SPIN_GAP`] of the last
//! and with no CQ of the device armed in between, make the polls run turns, and the engine
//! thread naps until they stop for [`SPIN_GRACE`]. The spinning thread would burn its core
//! either way; this way it does the engine's work on it, where before two threads per process
//! (the spinner and the engine) shared the cores. A program that polls a few times and then
//! waits on a completion channel arms its CQ first (Request Completion Notification), which
//! starts the count again: however close its events come, it is never taken for a spinner.
//! The doorbell makes a system call only when the engine thread is about to sleep or asleep
//! (a Dekker-style flag pair).
//!
//! Whatever gives the device something to send rings or is a turn's work: posts and
//! modifies ring, a turn that received or ran timers reports work (the next flush sends it).
//!
//! A poller's turn starts with the transmit flush and leaves what its receiving produced
//! (ACKs) for the next one; on the UDP link, while nothing is posted, the next
//! [`ACK_HOLD_TURNS`] turns leave it too, so that an ACK leaves with the answer the
//! application posts on seeing the completion, in one system call, though the application
//! polls again in between. While the program has taken no completion since, the turns go on
//! taking datagrams in and leaving what is owed, for [`ack_wait_ns`]: a program that waits
//! for its own request's ACK answers once that ACK is in, and the peer sends it right behind
//! the request just taken in.
//!
//! Imports: the verbs `Context` (the sans-IO interface) and `os`; nothing of any one link.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::clock::Clock;
use super::os;
use crate::verbs::Context;

/// A link's I/O, as the driver runs it.
pub(crate) trait Port: Send + 'static {
    /// One turn. On the engine thread (`inline` false): receive a batch and deliver it, run
    /// expired timers, flush what the device has to send. Inline (a poller's turn, which the
    /// driver starts with a [`Port::flush`] or not, see [`ACK_HOLD_TURNS`]): receive and run
    /// timers, and leave what they produced for the next poll or post, so that an ACK and the
    /// reply the application posts on seeing its completion leave together. Returns whether
    /// anything happened.
    fn turn(&mut self, inline: bool, now: u64) -> bool;
    /// Whether a flush costs a system call, which holding what a poller's turn owes for the
    /// answer saves (see [`ACK_HOLD_TURNS`]). A link whose flush is a store into a ring
    /// (shared memory) gains nothing: the ACK held then only delays the answer it travels
    /// with (`softhca perf send --lat --link shm`, p50 1.12 → 1.26 µs).
    fn holds_acks(&self) -> bool {
        false
    }
    /// A poller's turn while the driver holds what is owed (see [`ACK_HOLD_TURNS`]): what
    /// costs no system call, at least the rest of a batch an earlier turn left. The program
    /// is between a completion and its answer, where each system call delays the answer.
    fn held_turn(&mut self, now: u64) -> bool {
        self.turn(true, now)
    }
    /// Sends what the device has to send (the doorbell's work). Returns whether anything left.
    fn flush(&mut self, now: u64) -> bool;
    /// Work left behind that a sleeping engine thread must be woken for: more to send than
    /// one flush sends, or the rest of a received batch.
    fn leftovers(&self) -> bool;
    /// The descriptor that becomes readable when datagrams arrive.
    fn rx_fd(&self) -> RawFd;
    /// The link is closing: write out what it buffers (a pcap tap).
    fn close(&mut self);
    /// The engine thread is about to sleep on [`Port::rx_fd`]: a port whose senders must be
    /// told to wake it says so where they look; false when something arrived meanwhile and
    /// the thread should not sleep.
    fn prepare_sleep(&mut self) -> bool {
        true
    }
    /// What the engine thread naps with while a poller drives ([`Driver::background`]): a
    /// port whose senders can tell that the poller has left their datagrams untaken, and ring
    /// [`Port::rx_fd`] then, gives a [`Napper`]. Without one the engine thread watches the
    /// descriptor itself (the UDP link: it becomes readable with every datagram, the
    /// poller's too; see [`ReadyWatch`]).
    fn napper(&self) -> Option<Box<dyn Napper>> {
        None
    }
    /// The engine thread's turn while it stands in for a poller that has stopped (a program
    /// that spins on memory): as an engine turn, but what it takes in produces (the ACK of a
    /// Write that landed) is left for the application's next post or poll, for up to
    /// [`stand_in_hold_ns`] (see there). Returns whether anything happened, and whether what
    /// it produced was left unsent; if it was not, the turn flushed (the driver then counts
    /// the doorbells rung before it as sent).
    fn stand_in(&mut self, now: u64) -> (bool, bool);
}

/// The engine thread's side of a port's naps, used without the port's lock: taking the lock
/// to begin a nap waited for the poller's turn, and a doorbell rung meanwhile found the port
/// taken and was never honoured (a busy-poll Write over shm lost a quarter).
pub(crate) trait Napper: Send {
    /// A nap begins: the port's senders are told where they look, and are to ring
    /// [`Port::rx_fd`] should the poller leave their datagrams untaken. The port's next
    /// engine-thread turn takes the word back.
    fn prepare(&mut self) -> Nap;
    /// The nap ended because [`Port::rx_fd`] became readable: drain it.
    fn end(&mut self);
}

/// How the engine thread naps ([`Napper::prepare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nap {
    /// On [`Port::rx_fd`], which the port's peers make readable when the poller leaves their
    /// datagrams untaken; for no longer than `check` if datagrams already wait that nobody
    /// watches (the next nap asks again).
    OnBell { check: Option<Duration> },
    /// The poller has left datagrams untaken: no nap, the engine thread takes over.
    TakeOver,
}

/// How the engine thread naps while a poller drives: with the port's [`Napper`], or watching
/// the port's descriptor itself ([`ReadyWatch`]).
enum Naps {
    Port(Box<dyn Napper>),
    Watch(ReadyWatch),
}

/// The engine thread's naps beside a poller on a port with no [`Napper`] (the UDP link). Its
/// descriptor is readable while any datagram waits, those the poller is about to take
/// included, so a wake-up on it only asks the question, and the poller's signs of life answer
/// it: a poller that spins on its CQ polls again within a microsecond or so. One that has
/// gone (perftest's `ib_write_lat` spins on memory once its send has completed, and the
/// peer's Write lands behind that ACK) leaves the datagrams to this thread, which stands in
/// at once instead of at the end of a blind nap: `ib_write_lat` 64 KiB over UDP took 0.5-2 ms
/// a round trip with blind naps (2026-11-30, an AMD EPYC), and 8 B fell into 2 ms rounds
/// now and then, in blocking mode too.
///
/// Watching costs a wake-up of this thread in the kernel for every datagram a poller at work
/// takes first (the descriptor was readable a moment), beside that poller on a machine of
/// two cores: `ib_read_lat` over UDP, whose program never leaves its CQ, 7 -> 9 µs a round
/// trip. So the naps watch only for [`WATCHFUL`] after the thread last took over; before,
/// they are blind, and one that finds on waking that the program took completions last,
/// did nothing since and left datagrams waiting takes over, as a watch would have at once.
#[derive(Debug, Default)]
struct ReadyWatch {
    /// The poller's count of signs of life when it was found gone: while the count stays,
    /// the poller is away and a readable descriptor means datagrams nobody takes.
    gone: Option<u64>,
    /// When the thread last took over (ns since the epoch; 0: never).
    took_at: u64,
}

/// How long after the engine thread last took over from a poller its naps watch the port's
/// descriptor ([`ReadyWatch`]): a program that left its CQ for memory once does so again.
const WATCHFUL: Duration = Duration::from_millis(100);

/// How long the engine thread, woken by a datagram, watches for a sign of life of the poller
/// before it takes the datagram for gone unattended ([`ReadyWatch`]): a few times a spinning
/// poller's gap between polls (a turn, about a microsecond natively), which under emulation
/// (the rxe guest, TCG) is hundreds of microseconds. Every round of a program that spins on
/// memory waits this long: `ib_write_lat` 64 KiB busy-poll over UDP, 10 µs against 4,
/// seven interleaved rounds, 51.8-61.2 -> 49.8-52.7 µs typical, the rest level. Only a
/// program whose last act was taking completions is watched at all.
fn watch_ns() -> u64 {
    super::clock::on_this_host(4_000, 400_000)
}

impl ReadyWatch {
    /// Whether a nap that begins at `now`, the poller's count at `polls`, watches the
    /// descriptor: while the poller is still gone, and for [`WATCHFUL`] after a take-over.
    fn watches(&mut self, polls: u64, now: u64) -> bool {
        if self.gone.is_some_and(|g| g != polls) {
            self.gone = None; // the poller is back
        }
        self.gone.is_some() || (self.took_at != 0 && now.saturating_sub(self.took_at) < WATCHFUL.as_nanos() as u64)
    }

    /// A datagram woke the thread on the poller's core, the poller's count at `polls`:
    /// whether it gives the core back a while before it decides (a sleep of [`watch_ns`]).
    /// Not if the poller took completions last and has had its core since (it did not come
    /// back for these datagrams); always if this thread stood in and took the core again.
    fn gives_back_first(&self, polls: u64, just_handed: bool) -> bool {
        self.gone == Some(polls) || !just_handed
    }

    /// Datagrams wait, the poller's count at `polls`; `moved`: whether the count moved while
    /// the thread watched (on another core), gave the poller's core back, or napped blind,
    /// or the datagrams were taken meanwhile; `just_handed`: whether the program's last act
    /// was taking completions. Returns whether the thread takes over. A poller that did not
    /// move and took completions last has what it waited for, and may spin on memory now;
    /// one that posted or polled for nothing last is only kept from its core a while (by a
    /// busy thread of a peer, on a machine of two cores), and comes back: standing in beside
    /// it, on such a machine, cost `ib_write_bw` a fifth. While the count stays where the
    /// poller was found gone, it is still away, and what arrives is taken in without a watch
    /// (but for this thread on its core: see [`ReadyWatch::gives_back_first`]).
    fn takes_over(&mut self, polls: u64, on_its_core: bool, moved: bool, just_handed: bool, now: u64) -> bool {
        let still_gone = self.gone == Some(polls) && !on_its_core;
        let take = still_gone || (!moved && just_handed);
        if take {
            self.gone = Some(polls);
            self.took_at = now.max(1);
        } else {
            self.gone = None;
        }
        take
    }
}

/// The driver's own counters: engine thread sleeps and doorbell system calls.
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    pub sleeps: AtomicU64,
    pub doorbells: AtomicU64,
    /// Whole turns the application's polls ran.
    pub poller_turns: AtomicU64,
    /// Naps cut short to stand in for a poller that left datagrams untaken: a peer rang, or
    /// the port saw it itself (see [`Port::napper`]).
    pub naps_cut: AtomicU64,
}

/// Flags shared by the engine thread, the doorbell and inline callers.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub stop: AtomicBool,
    /// The engine thread is (about to be) asleep in `ppoll`.
    sleeping: AtomicBool,
    /// Until when it sleeps (ns since the epoch); 0 while it is still deciding.
    sleep_until: AtomicU64,
    /// Doorbells rung (posts, Modify QP), and when the last was (ns since the epoch).
    rings: AtomicU64,
    rung_at: AtomicU64,
    /// When an application thread last ran a whole engine turn inline (busy-poll), ns since
    /// the epoch; 0: never.
    last_inline: AtomicU64,
    /// The doorbell count the last transmit flush covered. With `owed`, only a hint for the
    /// napping engine thread (a stale value costs it one needless flush), so both are written
    /// Relaxed on the poller's hot path.
    rings_flushed: AtomicU64,
    /// An inline turn took packets in after its flush: what they produced (ACKs) waits for
    /// the next turn.
    owed: AtomicBool,
    /// Poller turns in a row that have left what was owed in place (see [`ACK_HOLD_TURNS`]).
    held: AtomicU64,
    /// When the turn that left `owed` ran and when a turn holding it last took something in
    /// (ns since the epoch), and the program's count of polls that took completions as that
    /// first turn's poll began (`handed_seen` then): see [`ack_wait_ns`].
    owed_at: AtomicU64,
    owed_last: AtomicU64,
    handed_owed: AtomicU64,
    /// When the engine thread, standing in, left what its turn owes for the application's
    /// next post (ns since the epoch; 0: nothing so left). See [`Port::stand_in`].
    left_at: AtomicU64,
    /// Blocking mode's spin detector: when a CQ was last polled (ns since the epoch), how
    /// many polls in a row came within [`SPIN_GAP`] of the one before, and the device's
    /// count of CQ arms the streak started after.
    last_poll: AtomicU64,
    poll_streak: AtomicU64,
    arms_seen: AtomicU64,
    /// The device's count of polls that handed completions ([`Context::handed`]) as the
    /// application's last poll or post began: if the count has moved since, the last thing
    /// the application did was take completions.
    handed_seen: AtomicU64,
    /// The CPU a poller's turn ran on lately ([`os::current_cpu`], asked every
    /// [`CPU_EVERY`]th turn).
    poller_cpu: AtomicU32,
    /// Polls that ran no turn because they found the port taken (by the engine thread, or
    /// another poller). The engine thread counts them as the pollers' signs of life.
    idle_polls: AtomicU64,
}

/// What the engine thread, the doorbell and the progress hook share.
pub(crate) struct Driver<P: Port> {
    pub ctx: Context,
    /// Busy-poll mode (see the module docs); a link may switch it while it runs.
    busy: AtomicBool,
    pub clock: Clock,
    pub shared: Shared,
    pub wakes: Wakes,
    /// The doorbell eventfd.
    pub efd: OwnedFd,
    rx_fd: RawFd,
    /// The port's flush is a system call ([`Port::holds_acks`]): a doorbell leaves its flush
    /// to a spinning poller, which sends it with what else is ready in one call.
    batches: bool,
    port: Mutex<P>,
}

/// A running driver: its engine thread, started with the hooks installed, and stopped when
/// it is dropped (or by [`Running::shutdown`]).
pub(crate) struct Running<P: Port> {
    pub link: Arc<Driver<P>>,
    thread: Option<JoinHandle<()>>,
}

impl<P: Port> Running<P> {
    /// Builds the driver of `port` for `ctx`, hooks it into the device and starts its engine
    /// thread (named after the device).
    pub fn start(ctx: Context, busy: bool, clock: Clock, port: P, name: &str) -> std::io::Result<Running<P>> {
        let link = Arc::new(Driver::new(ctx, busy, clock, port)?);
        link.install();
        let bg = link.clone();
        match std::thread::Builder::new().name(format!("{name}-engine")).spawn(move || bg.background()) {
            Ok(t) => Ok(Running { link, thread: Some(t) }),
            Err(e) => {
                link.uninstall();
                Err(e)
            }
        }
    }

    /// Sends what the device owes its peers (ACKs of what was completed, those of destroyed
    /// QPs), unhooks the driver and stops and joins the engine thread. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(t) = self.thread.take() else { return };
        // Handlers that fires run after the port is let go.
        crate::verbs::effects::scope(|| self.link.drive_inline(false));
        self.link.uninstall();
        self.link.stop();
        // Dropped on the engine thread itself (from a handler it ran): it sees `stop` and
        // ends on its own; joining itself would deadlock.
        if t.thread().id() != std::thread::current().id() {
            let _ = t.join();
        }
    }
}

impl<P: Port> Drop for Running<P> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Adds to a counter written outside the port's lock (doorbells, sleeps).
fn bump_shared(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// While an application thread ran a turn inline within this long, and spins ([`POLL_WINDOW`]),
/// the busy-poll engine thread naps instead of competing with it for the socket and the core.
const INLINE_GRACE: Duration = Duration::from_millis(10);
/// Busy-poll mode: a poller spins if it polled at least [`WINDOW_POLLS`] times within the last
/// window this long. One that polls now and then (UCX's progress thread, a program between
/// phases) must not keep the engine thread napping while a peer's requests wait: UCX's
/// `ucp_get` over busy-poll took 2.2 ms per 64 KiB Read when any poll within INLINE_GRACE
/// counted, its target's only polls being its progress thread's. (A shorter grace instead
/// woke the napping engine thread five times as often, and a busy-poll Write lost 10-15%.)
const POLL_WINDOW: Duration = Duration::from_millis(1);
/// See [`POLL_WINDOW`]. Low enough for a spinner in an emulated guest (TCG), whose polls each
/// run a turn of tens of microseconds (a turn that sends a batch of 4 KiB packets, there,
/// can take most of a window); UCX's progress thread polls about once a millisecond or less.
const WINDOW_POLLS: u64 = 8;
/// With no application thread spinning on a CQ, the engine thread keeps turning this long
/// after its last work before it sleeps in `ppoll`, as the kernel's `busy_poll` sysctl does
/// for a socket: a request that follows its predecessor's answer within this long finds it
/// awake. A passive side (the target of Reads and Atomics, whose program does not poll)
/// answered at the pace of a wake-up without it (perftest's `ib_read_lat` 8 B over UDP:
/// 30-40 µs typical, busy-poll or not, the wake-up of a halted vCPU here; 5.2-5.6 with it).
/// 1 ms in busy-poll mode was tried: with it (and a poller taken for a spinner only at 64 polls
/// a window) the emulated guest's busy-poll `ib_write_bw` fell from 126 to 94 MiB/s.
const IDLE_SPIN: Duration = Duration::from_micros(50);
/// Blocking mode: this many CQ polls in a row, each within [`SPIN_GAP`] of the last, mean
/// the application spins, and its polls run the engine (see the module docs).
pub(crate) const SPIN_POLLS: u64 = 64;
/// See [`SPIN_POLLS`]. Wide enough for a poll loop in an emulated guest (TCG), whose rounds
/// take tens of microseconds: there the engine thread, starved beside the spinner and the
/// kernel, fell seconds behind its socket. An event-driven program is told apart by its
/// arming, not by its pace: with the gap alone at this width, rping's polls on loopback
/// (events less than 200 µs apart) counted as spinning and its exit raced its CM thread.
pub(crate) const SPIN_GAP: Duration = Duration::from_micros(200);
/// Blocking mode: the engine thread takes over again this long after a spinning application's
/// last turn (busy-poll mode waits [`INLINE_GRACE`]), so that a program that stops spinning
/// to wait on a completion channel waits at most this once.
const SPIN_GRACE: Duration = Duration::from_millis(1);
/// A doorbell leaves its transmit work to the poller if it polled this recently (busy-poll,
/// or a spinning poller in blocking mode), on a link whose flush is a system call, while the
/// engine thread is awake (see [`Driver::ring`]).
const DOORBELL_DEFER: Duration = Duration::from_micros(50);
/// How many poller turns in a row, with nothing posted since, leave the ACKs an earlier turn
/// owes unsent, on a link whose flush is a system call ([`Port::holds_acks`]): a program that
/// has just taken a completion polls again, its CQ or another, before it posts the reply
/// (softhca perf drains its CQ, perftest's `ib_send_lat` polls its send CQ), and a flush at
/// the head of that poll sent the ACK alone, one more system call each round trip on the UDP
/// link, where the reply would have taken it along. The next post's flush, or the turn after
/// these, sends it; a poller that stops leaves it to the engine thread, as before. None of
/// these turns takes a packet in without its ACK leaving at the next flush (PKT-ACK-13 asks
/// that nothing waits for packets not yet received). Before these turns count, while the
/// program has taken no completion since the ACK was owed, [`ack_wait_ns`] holds it.
const ACK_HOLD_TURNS: u64 = 2;
/// While a poller drives the engine, the engine thread looks this often for a doorbell left
/// to a poller that has stopped since.
const DEFERRED_CHECK: Duration = Duration::from_millis(1);
/// The engine thread wakes at least this often even with no deadline, so that a deadline an
/// inline transmit sets later than this needs no wake-up call.
const IDLE_WAKE: Duration = Duration::from_millis(50);
/// A poller that has run no turn and posted nothing for this long is not spinning on a CQ
/// now, whatever its rate of polls was: the engine thread ends its nap and stands in. A
/// program may spin on memory instead, waiting for an RDMA Write that only this device can
/// take in (perftest's `ib_write_lat` polls the last byte of its buffer between its CQ
/// polls); the engine thread napped on for the rest of [`POLL_WINDOW`] or [`INLINE_GRACE`]
/// and each hop waited for it: 1.4-2 ms typical over shm, 2 ms for 64 KiB over UDP
/// (2026-11-29, the Intel Xeon). Longer than a spinner's gap between two polls (its turn
/// holds the port, which the engine thread then finds taken and naps on); under emulation
/// (the rxe guest, TCG) those gaps are hundreds of microseconds: 50 µs there had the engine
/// thread stand in beside a spinning `ib_send_lat` over UDP, 88 -> 222 µs typical.
fn poller_quiet_ns() -> u64 {
    super::clock::on_this_host(100_000, 2_000_000)
}
/// How long what the engine thread's turn standing in owes waits for the application's next
/// post or poll ([`Port::stand_in`]). A program that spins on memory answers the Write it
/// waited for within a microsecond or two, and its post's flush then takes the ACK along: the
/// peer, polling its CQ for that ACK, finds the answer beside it and takes both in, so that
/// the next Write does not wait for the peer's napping engine thread (`ib_write_lat` over shm,
/// where the ACK sent at once left every hop to a sender's watch). A program that does not
/// answer delays its peer's completion by this much.
fn stand_in_hold_ns() -> u64 {
    super::clock::on_this_host(10_000, 200_000)
}
/// How long a poller's turns go on taking datagrams in while what an earlier turn owes (the
/// ACK of a peer's request) stays held, as long as the program has polled and taken no
/// completion since: this long after the last datagram such a turn took in, and four times
/// this after the ACK was first owed. Such a program waits for something, most often the
/// ACK of its own request, which the peer sends right behind the request just taken in
/// (`Context::acks_after_requests`), and answers once it has it: its post's flush then
/// takes the held ACK along, behind the answer, and the peer, polling for that ACK, takes
/// the answer in with it. Sent at once instead, the ACK completed the peer's request alone,
/// the peer's program turned to memory (perftest's `ib_write_lat` spins on its buffer for
/// the next Write), and the answer had to wait for the peer's engine thread: 64 KiB
/// `ib_write_lat` over UDP, whose ACK comes about 10 µs after the Write's first datagram,
/// took 40-55 µs a round in most runs (2026-11-30). More requests taken in meanwhile are
/// covered by the same ACK (PKT-ACK-4); a peer whose Local ACK Timeout is shorter than the
/// hold (timeout 3 or less, 33 µs) may retransmit in vain.
fn ack_wait_ns() -> u64 {
    super::clock::on_this_host(10_000, 200_000)
}
/// A poller's turn notes its CPU (for the engine thread's naps, `nap_watching`) once in this
/// many: the call was 30 of the 560 instructions of an empty busy poll over shared memory, a
/// poller moves between CPUs seldom, and a nap that misjudges the core once only naps
/// differently.
const CPU_EVERY: u64 = 64;
/// The shortest nap: a wake-up costs a core's time beside a spinning poller.
const MIN_NAP: Duration = Duration::from_micros(200);

/// Busy-poll mode: whether the application spins, from its polls (inline turns and polls that
/// found the port taken) counted over [`POLL_WINDOW`]s.
struct PollRate {
    /// When the current window began, and the count then.
    at: u64,
    polls: u64,
    /// The verdict of the last whole window.
    spins: bool,
}

impl Default for PollRate {
    fn default() -> PollRate {
        // Until a window has passed, a poller counts as spinning, as before any window.
        PollRate { at: 0, polls: 0, spins: true }
    }
}

impl PollRate {
    /// `polls`: the running count at `now`.
    fn spins(&mut self, now: u64, polls: u64) -> bool {
        if now.saturating_sub(self.at) >= POLL_WINDOW.as_nanos() as u64 {
            self.spins = polls.wrapping_sub(self.polls) >= WINDOW_POLLS;
            (self.at, self.polls) = (now, polls);
        }
        self.spins
    }
}

impl<P: Port> Driver<P> {
    pub fn new(ctx: Context, busy: bool, clock: Clock, port: P) -> std::io::Result<Driver<P>> {
        let rx_fd = port.rx_fd();
        Ok(Driver {
            ctx,
            busy: AtomicBool::new(busy),
            clock,
            shared: Shared::default(),
            wakes: Wakes::default(),
            efd: os::eventfd()?,
            rx_fd,
            batches: port.holds_acks(),
            port: Mutex::new(port),
        })
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// Hooks the driver into its device: the doorbell after every post and modify, and the
    /// progress hook that runs a turn inline on a CQ poll (busy-poll mode, or a spinning
    /// poller in blocking mode). The hooks hold the driver weakly: the device must not keep its
    /// own driver alive.
    pub fn install(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.ctx.set_doorbell(move || {
            if let Some(l) = weak.upgrade() {
                l.ring();
            }
        });
        let weak = Arc::downgrade(self);
        self.ctx.set_progress(Some(Arc::new(move || {
            // Work the poller's turn left (the rest of a batch, more to send) must not wait
            // for the engine thread's idle wake if the poller stops here.
            if let Some(l) = weak.upgrade() {
                l.shared.handed_seen.store(l.ctx.handed(), Ordering::Relaxed);
                if let (true, now) = l.polled() {
                    if l.drive_inline_at(true, now) {
                        l.wake_for_leftovers();
                    }
                }
            }
        })));
    }

    /// Switches busy-poll mode on or off while the device runs (the progress hook asks).
    pub fn set_busy_poll(&self, on: bool) {
        self.busy.store(on, Ordering::Relaxed);
    }

    /// A CQ poll: whether it runs a turn, which it does in busy-poll mode and, in blocking
    /// mode, once the application spins (see the module docs); and the time, where it read
    /// it (the turn uses it: under emulation a clock read can cost a microsecond).
    fn polled(&self) -> (bool, Option<u64>) {
        if self.busy() {
            return (true, None);
        }
        // Loads and stores, no locked read-modify-write: pollers racing here may lose a
        // count or a time, which only delays telling a spinner (see `note_idle_poll`).
        let s = &self.shared;
        let now = self.now();
        let last = s.last_poll.load(Ordering::Relaxed);
        s.last_poll.store(now, Ordering::Relaxed);
        let arms = self.ctx.notify_requests();
        let armed = s.arms_seen.load(Ordering::Relaxed) != arms;
        if armed || now.saturating_sub(last) > SPIN_GAP.as_nanos() as u64 {
            s.arms_seen.store(arms, Ordering::Relaxed);
            s.poll_streak.store(0, Ordering::Relaxed);
            return (false, None);
        }
        let streak = s.poll_streak.load(Ordering::Relaxed) + 1;
        s.poll_streak.store(streak, Ordering::Relaxed);
        (streak >= SPIN_POLLS, Some(now))
    }

    /// Whether the application's polls drive the engine: busy-poll mode, or a spinning
    /// application in blocking mode.
    fn pollers_drive(&self) -> bool {
        self.busy() || self.shared.poll_streak.load(Ordering::Relaxed) >= SPIN_POLLS
    }

    /// Counts a poll that ran no turn. Relaxed load and store, not a locked add: pollers
    /// racing may lose a count, and the engine thread only asks whether it moved.
    fn note_idle_poll(&self) {
        let n = self.shared.idle_polls.load(Ordering::Relaxed).wrapping_add(1);
        self.shared.idle_polls.store(n, Ordering::Relaxed);
    }

    /// Unhooks the driver from its device (see [`Driver::install`]).
    pub fn uninstall(&self) {
        self.ctx.set_progress(None);
        self.ctx.clear_doorbell();
    }

    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    pub fn lock_port(&self) -> MutexGuard<'_, P> {
        self.port.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_port(&self) -> Option<MutexGuard<'_, P>> {
        match self.port.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Runs the engine on the calling thread unless another thread is running it: a whole
    /// turn (`full`: the progress hook, busy-poll) or the transmit side only (the doorbell).
    /// A doorbell rung while another thread held the port is honoured by that thread when it
    /// lets go: it rechecks the ring count after unlocking (the ringer counts before trying).
    /// Returns whether it left work behind ([`Port::leftovers`]), which a sleeping engine
    /// thread must be woken for.
    pub fn drive_inline(&self, full: bool) -> bool {
        self.drive_inline_at(full, None)
    }

    /// [`Driver::drive_inline`] with the time, if the caller has just read it.
    fn drive_inline_at(&self, mut full: bool, mut known: Option<u64>) -> bool {
        loop {
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let left = {
                let Some(mut p) = self.try_port() else {
                    // A poller that finds the engine thread at the port still polls: said so,
                    // the engine thread leaves the port to it (a busy-poll engine thread that
                    // never heard of it turned beside the poller, each taking the port from
                    // the other, for up to INLINE_GRACE: 6-10 us hops in short runs).
                    if full {
                        self.note_idle_poll();
                    }
                    return false;
                };
                let now = known.take().unwrap_or_else(|| self.now());
                // Held: something is owed, nothing was posted since the last flush, and
                // either the program has taken no completion since (`waiting`, within
                // `ack_wait_ns`: such turns take datagrams in) or the turns in a row that
                // have held it are fewer than ACK_HOLD_TURNS.
                let owed = full
                    && p.holds_acks()
                    && self.shared.owed.load(Ordering::Relaxed)
                    && self.shared.rings_flushed.load(Ordering::Relaxed) == seen;
                let waiting = owed
                    && self.shared.handed_seen.load(Ordering::Relaxed)
                        == self.shared.handed_owed.load(Ordering::Relaxed)
                    && now.saturating_sub(self.shared.owed_last.load(Ordering::Relaxed)) < ack_wait_ns()
                    && now.saturating_sub(self.shared.owed_at.load(Ordering::Relaxed)) < 4 * ack_wait_ns();
                let held_turn = owed && self.shared.held.load(Ordering::Relaxed) < ACK_HOLD_TURNS;
                if full {
                    // Only the port's holder writes it: no locked add.
                    let turns = &self.wakes.poller_turns;
                    let turn = turns.load(Ordering::Relaxed);
                    turns.store(turn + 1, Ordering::Relaxed);
                    self.shared.last_inline.store(now.max(1), Ordering::Relaxed);
                    if turn.is_multiple_of(CPU_EVERY) {
                        self.shared.poller_cpu.store(os::current_cpu(), Ordering::Relaxed);
                    }
                    // A poller's turn leaves the ACKs it owes for the next poll or post, so
                    // that they leave with the reply in one send, in busy-poll mode and for a
                    // spinning poller in blocking mode alike; if the poller stops, the engine
                    // thread flushes them (`background`). Nothing sent later can overtake them:
                    // a flush takes QPs in the order they became ready, and a request goes
                    // ahead only of its own flow's responses (the DREQ of a disconnect that
                    // answers the last completion leaves after that completion's ACK).
                    if waiting {
                        if p.turn(true, now) {
                            self.shared.owed_last.store(now, Ordering::Relaxed);
                        }
                    } else if held_turn {
                        // Only the port's holder writes it: no locked add.
                        let held = self.shared.held.load(Ordering::Relaxed);
                        self.shared.held.store(held + 1, Ordering::Relaxed);
                        p.held_turn(now);
                    } else {
                        self.shared.held.store(0, Ordering::Relaxed);
                        self.shared.left_at.store(0, Ordering::Relaxed);
                        let flushed = p.flush(now);
                        let took = p.turn(true, now);
                        self.shared.owed.store(took || flushed, Ordering::Relaxed);
                        // Only what a turn took in can be waited on (`ack_wait_ns`); 0: nothing.
                        self.shared.owed_last.store(if took { now } else { 0 }, Ordering::Relaxed);
                        if took {
                            self.shared.owed_at.store(now, Ordering::Relaxed);
                            let handed = self.shared.handed_seen.load(Ordering::Relaxed);
                            self.shared.handed_owed.store(handed, Ordering::Relaxed);
                        }
                    }
                } else {
                    p.flush(now);
                    self.shared.left_at.store(0, Ordering::Relaxed);
                    self.shared.owed.store(false, Ordering::Relaxed);
                    self.shared.held.store(0, Ordering::Relaxed);
                }
                self.shared.rings_flushed.store(seen, Ordering::Relaxed);
                p.leftovers()
            };
            if self.shared.rings.load(Ordering::SeqCst) == seen {
                return left;
            }
            full = false;
        }
    }

    /// Wakes the engine thread if it sleeps, for work an application thread left it.
    pub fn wake_for_leftovers(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) {
            bump_shared(&self.wakes.doorbells, 1);
            os::eventfd_signal(self.efd.as_raw_fd());
        }
    }

    /// The doorbell: transmit inline, then wake the engine thread only if it sleeps past a
    /// deadline that the new work set.
    pub fn ring(&self) {
        self.shared.rings.fetch_add(1, Ordering::SeqCst);
        self.shared.handed_seen.store(self.ctx.handed(), Ordering::Relaxed);
        let now = self.now();
        self.shared.rung_at.store(now, Ordering::Relaxed);
        if self.batches && !self.shared.sleeping.load(Ordering::SeqCst) && self.poller_spinning_at(now) {
            // The poller's next turn starts by transmitting: leave the work to it, so that
            // several posts (and a pending ACK) go out in one system call. Where a flush is
            // no system call (shared memory), the post sends at once: one clock read, not a
            // deferral's two. Not while the engine thread sleeps in `ppoll`: should the
            // poller turn to another device's CQ, nobody would send the post until that sleep
            // ends (up to IDLE_WAKE; one thread driving two devices waited 15-50 ms a round
            // trip).
            return;
        }
        if self.drive_inline_at(false, Some(now)) {
            self.wake_for_leftovers(); // more than one flush sends: the engine thread goes on
            return;
        }
        if self.shared.sleeping.load(Ordering::SeqCst) {
            let until = self.shared.sleep_until.load(Ordering::SeqCst);
            if until == 0 || self.ctx.poll_timeout().is_some_and(|t| t < until) {
                bump_shared(&self.wakes.doorbells, 1);
                os::eventfd_signal(self.efd.as_raw_fd());
            }
        }
    }

    /// Stops the engine thread (it ends its current turn first).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        os::eventfd_signal(self.efd.as_raw_fd());
    }

    /// Whether a poller ran a turn within [`DOORBELL_DEFER`] (it is spinning on its CQ).
    fn poller_spinning(&self) -> bool {
        self.poller_spinning_at(self.now())
    }

    fn poller_spinning_at(&self, now: u64) -> bool {
        let last = self.shared.last_inline.load(Ordering::Relaxed);
        self.pollers_drive() && last != 0 && now.saturating_sub(last) < DOORBELL_DEFER.as_nanos() as u64
    }

    /// Whether an application thread is driving the engine inline (busy-poll, or a spinning
    /// poller in blocking mode): for how much longer the engine thread leaves it the port.
    /// `idle_at`: when the engine thread last saw the count of idle polls move.
    fn inline_active(&self, now: u64, idle_at: u64) -> Option<Duration> {
        let last = self.shared.last_inline.load(Ordering::Relaxed).max(idle_at);
        let idle = Duration::from_nanos(now.saturating_sub(last));
        let grace = if self.busy() { INLINE_GRACE } else { SPIN_GRACE };
        (self.pollers_drive() && last != 0 && idle < grace).then(|| grace - idle)
    }

    /// Until when what the engine thread's turn standing in owes waits for the application's
    /// next post ([`Port::stand_in`]), if it left anything.
    fn left_until(&self) -> Option<u64> {
        let at = self.shared.left_at.load(Ordering::Relaxed);
        (at != 0).then(|| at + stand_in_hold_ns())
    }

    /// Whether what the engine thread's turn standing in owes still waits for the
    /// application's next post.
    fn leaves(&self, now: u64) -> bool {
        self.left_until().is_some_and(|until| now < until)
    }

    /// What the engine thread, napping beside a poller, would flush for it: doorbells rung
    /// since the last flush, or what a turn owes, unless the engine thread's own turn
    /// standing in left it for the application's next post and [`stand_in_hold_ns`] has not
    /// passed.
    fn deferred(&self, now: u64) -> bool {
        let posted = self.shared.rings.load(Ordering::SeqCst) != self.shared.rings_flushed.load(Ordering::Relaxed);
        posted || (self.shared.owed.load(Ordering::Relaxed) && !self.leaves(now))
    }

    /// The engine thread's turn standing in for a quiet poller ([`Port::stand_in`]): whether
    /// it did anything, and whether it left what that produced for the application's next
    /// post (which [`Driver::deferred`] then holds back).
    fn stand_in(&self, p: &mut P, now: u64) -> (bool, bool) {
        let (worked, left) = p.stand_in(now);
        if left {
            self.shared.owed.store(true, Ordering::Relaxed);
            if self.shared.left_at.load(Ordering::Relaxed) == 0 {
                // The hold counts from now, the turn's end: `now` is its start, and landing a
                // long Write can take longer than the hold.
                self.shared.left_at.store(self.now(), Ordering::Relaxed);
            }
        }
        (worked, left)
    }

    /// Whether the poller has run no turn and posted nothing for [`poller_quiet_ns`] (see
    /// there). A program busy posting (perftest's `ib_write_bw` posts a queue's worth between
    /// polls) is not quiet: standing in beside it cost a busy-poll Write over shm a tenth.
    fn poller_quiet(&self, now: u64) -> bool {
        let last = self.shared.last_inline.load(Ordering::Relaxed).max(self.shared.rung_at.load(Ordering::Relaxed));
        now.saturating_sub(last) >= poller_quiet_ns()
    }

    /// The engine thread naps for `d` while a poller drives: on [`Port::rx_fd`], where the
    /// port's peers ring it when the poller has stopped taking their datagrams in
    /// ([`Port::napper`]), or, on a port without one, watching it ([`ReadyWatch`]). Returns
    /// whether the poller left datagrams untaken (a peer rang, the port saw it before the nap
    /// began, or the watch found the poller gone): the engine thread takes over.
    fn nap(&self, naps: &mut Naps, d: Duration) -> bool {
        let napper = match naps {
            Naps::Port(napper) => napper,
            Naps::Watch(watch) => return self.nap_watching(watch, d),
        };
        let d = match napper.prepare() {
            Nap::TakeOver => return true,
            Nap::OnBell { check } => check.map_or(d, |c| c.min(d)),
        };
        let (rang, doorbell) = self.wait(d);
        if doorbell {
            os::eventfd_drain(self.efd.as_raw_fd());
        }
        if rang {
            napper.end();
        }
        rang
    }

    /// A nap on a port without a [`Napper`] (see [`ReadyWatch`]).
    fn nap_watching(&self, watch: &mut ReadyWatch, d: Duration) -> bool {
        let polls = self.signs_of_life();
        if !watch.watches(polls, self.now()) {
            std::thread::sleep(d);
            let moved = self.signs_of_life() != polls || !self.datagrams_wait();
            return watch.takes_over(polls, false, moved, self.just_handed(), self.now());
        }
        let (readable, doorbell) = self.wait(d);
        if doorbell {
            os::eventfd_drain(self.efd.as_raw_fd());
        }
        if !readable {
            return false;
        }
        let polls = self.signs_of_life();
        let on_its_core = self.shared.poller_cpu.load(Ordering::Relaxed) == os::current_cpu();
        let moved = if on_its_core {
            // This thread has the poller's core, which the poller needs to move at all.
            if watch.gives_back_first(polls, self.just_handed()) {
                std::thread::sleep(Duration::from_nanos(watch_ns()));
            }
            self.signs_of_life() != polls
        } else {
            watch.gone != Some(polls) && self.poller_moves(polls, watch_ns())
        };
        // What woke this thread may be gone already, into the poll that handed the program
        // its completion (a Read's response): then the poller took it, and it is at work.
        let moved = moved || !self.datagrams_wait();
        watch.takes_over(polls, on_its_core, moved, self.just_handed(), self.now())
    }

    /// Whether datagrams wait on the port's descriptor now (a look, no wait).
    fn datagrams_wait(&self) -> bool {
        self.wait(Duration::ZERO).0
    }

    /// The application's signs of life: the turns its polls ran, its polls that found the
    /// port taken, and its posts (a program busy posting, `ib_write_bw`'s, polls again after).
    fn signs_of_life(&self) -> u64 {
        let turns = self.wakes.poller_turns.load(Ordering::Relaxed);
        let posts = self.shared.rings.load(Ordering::Relaxed);
        turns.wrapping_add(self.shared.idle_polls.load(Ordering::Relaxed)).wrapping_add(posts)
    }

    /// Whether the last thing the application did was take completions from a CQ poll (see
    /// `Shared::handed_seen`).
    fn just_handed(&self) -> bool {
        self.ctx.handed() != self.shared.handed_seen.load(Ordering::Relaxed)
    }

    /// Whether the poller's signs of life move past `polls` within `within` ns: this thread
    /// spins that long at most, already woken (a sleep would cost another wake-up).
    fn poller_moves(&self, polls: u64, within: u64) -> bool {
        let until = self.now() + within;
        loop {
            if self.signs_of_life() != polls {
                return true;
            }
            if self.now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Waits up to `d` in `ppoll` on the port's descriptor and the doorbell eventfd; returns
    /// which became readable (the port's, the doorbell's). The caller drains the doorbell.
    fn wait(&self, d: Duration) -> (bool, bool) {
        let mut fds = [
            libc::pollfd { fd: self.rx_fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.efd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        if let Err(e) = os::ppoll(&mut fds, Some(d)) {
            tracing::warn!(error = %e, "ppoll failed");
            return (false, false);
        }
        (fds[0].revents != 0, fds[1].revents != 0)
    }

    /// The engine thread. In blocking mode it runs every turn and sleeps in `ppoll` (port,
    /// doorbell eventfd, next deadline) when idle, [`IDLE_SPIN`] after its last work. In
    /// busy-poll mode it does the same only while no application thread spins on a CQ; while
    /// one does, it naps and leaves the port, the timers and the core to the poller.
    pub fn background(&self) {
        // Its sleeps are short and timed (a watch of microseconds, the hold of an ACK, naps
        // of a fraction of a millisecond): the default slack of 50 µs made each of them
        // 50 µs longer.
        os::precise_timers();
        // The count of idle polls last seen and when it was seen to move.
        let (mut idle_seen, mut idle_at) = (0, 0);
        // When this thread's last turn did some work (see IDLE_SPIN).
        let mut worked_at = 0;
        let mut rate = PollRate::default();
        let mut naps = self.lock_port().napper().map_or_else(|| Naps::Watch(ReadyWatch::default()), Naps::Port);
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = self.now();
            let idle = self.shared.idle_polls.load(Ordering::Relaxed);
            if idle != idle_seen {
                (idle_seen, idle_at) = (idle, now);
            }
            let polls = self.wakes.poller_turns.load(Ordering::Relaxed).wrapping_add(idle);
            let spins = !self.busy() || rate.spins(now, polls);
            // The poller drives, but has stopped turning for now (or a peer rang): this thread
            // takes a turn in its place, and naps again once the poller is back.
            let mut standing_in = false;
            if let Some(nap) = self.inline_active(now, idle_at).filter(|_| spins) {
                // A doorbell left to a poller that stopped polling right after it (the
                // application posted its last request and went to sleep), or ACKs its last
                // turn left for the next, are flushed here.
                if self.deferred(now) && !self.poller_spinning() && self.drive_inline(false) {
                    continue;
                }
                if !self.poller_quiet(now) {
                    if !self.nap(&mut naps, nap.min(DEFERRED_CHECK).max(MIN_NAP)) {
                        continue;
                    }
                    // The poller left datagrams untaken.
                    bump_shared(&self.wakes.naps_cut, 1);
                }
                standing_in = true;
            }
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let worked = if standing_in {
                match self.try_port() {
                    Some(mut p) => {
                        let now = self.now();
                        let (worked, left) = self.stand_in(&mut p, now);
                        if left {
                            // Nothing was flushed: `rings_flushed` stays.
                            worked_at = now;
                            continue;
                        }
                        worked
                    }
                    // Standing in for a quiet poller that is back (or in a long turn): nap.
                    None => {
                        self.nap(&mut naps, MIN_NAP);
                        continue;
                    }
                }
            } else if self.busy() {
                match self.try_port() {
                    Some(mut p) => p.turn(false, self.now()),
                    None => {
                        std::thread::yield_now();
                        continue;
                    }
                }
            } else {
                self.lock_port().turn(false, self.now())
            };
            self.shared.rings_flushed.store(seen, Ordering::Relaxed);
            if worked {
                worked_at = now;
                continue;
            }
            // Not while standing in for a quiet poller: that application thread spins on
            // something else (memory) on a core this thread would share by turns, and a
            // yield hands the core to the spinner for the rest of its slice (`ib_write_lat`
            // over shm, busy-poll, 2026-11-29: 8 B average 62 -> 23 µs, 99th percentile
            // 1.1-1.8 ms -> 75-520 µs); asleep, it is woken at once, and the spinner preempted.
            if now.saturating_sub(worked_at) < IDLE_SPIN.as_nanos() as u64 && !standing_in {
                std::thread::yield_now();
                continue;
            }
            // Sleep until the port, the doorbell or the next deadline (Dekker-style with
            // `ring`: flag first, then recheck the ring count).
            self.shared.sleep_until.store(0, Ordering::SeqCst);
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if self.shared.rings.load(Ordering::SeqCst) != seen || self.shared.stop.load(Ordering::SeqCst) {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let ready = self.try_port().is_some_and(|mut p| p.prepare_sleep());
            if !ready {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let now = self.now();
            let left = self.left_until().unwrap_or(u64::MAX);
            let until =
                self.ctx.poll_timeout().unwrap_or(u64::MAX).min(now + IDLE_WAKE.as_nanos() as u64).min(left).max(1);
            self.shared.sleep_until.store(until, Ordering::SeqCst);
            bump_shared(&self.wakes.sleeps, 1);
            let (_, doorbell) = self.wait(Duration::from_nanos(until.saturating_sub(now)));
            self.shared.sleeping.store(false, Ordering::SeqCst);
            if doorbell {
                os::eventfd_drain(self.efd.as_raw_fd());
            }
        }
        self.lock_port().close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::DeviceConfig;

    /// A port that counts its flushes; with `leaves`, its turns standing in take a Write in
    /// and leave its ACK.
    struct MockPort {
        flushes: Arc<AtomicU64>,
        batches: bool,
        leaves: bool,
        /// Whether its turns take something in (a datagram arrived), and how many ran.
        takes: Arc<AtomicBool>,
        turns: Arc<AtomicU64>,
        efd: OwnedFd,
    }

    /// A napper that answers as told.
    struct MockNapper(Nap);

    impl Napper for MockNapper {
        fn prepare(&mut self) -> Nap {
            self.0
        }
        fn end(&mut self) {}
    }

    impl Port for MockPort {
        fn turn(&mut self, _inline: bool, _now: u64) -> bool {
            self.turns.fetch_add(1, Ordering::Relaxed);
            self.takes.load(Ordering::Relaxed)
        }
        fn holds_acks(&self) -> bool {
            self.batches
        }
        fn flush(&mut self, _now: u64) -> bool {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            false
        }
        fn leftovers(&self) -> bool {
            false
        }
        fn rx_fd(&self) -> RawFd {
            self.efd.as_raw_fd()
        }
        fn close(&mut self) {}
        fn stand_in(&mut self, now: u64) -> (bool, bool) {
            (self.leaves || self.turn(false, now), self.leaves)
        }
    }

    struct Rig {
        driver: Driver<MockPort>,
        flushes: Arc<AtomicU64>,
    }

    /// A busy-poll driver (no engine thread: the test plays its part) over a mock port.
    fn rig(batches: bool) -> Rig {
        let (port, flushes) = mock(batches);
        let driver =
            Driver::new(Context::create(DeviceConfig::default()).unwrap(), true, Clock::start(), port).unwrap();
        Rig { driver, flushes }
    }

    fn mock(batches: bool) -> (MockPort, Arc<AtomicU64>) {
        let flushes = Arc::default();
        let port = MockPort {
            flushes: Arc::clone(&flushes),
            batches,
            leaves: false,
            takes: Arc::default(),
            turns: Arc::default(),
            efd: os::eventfd().unwrap(),
        };
        (port, flushes)
    }

    /// A busy-poll driver over a mock port whose turn standing in leaves something owed, and
    /// the port's flush count.
    fn leaving_rig() -> (Driver<MockPort>, Arc<AtomicU64>) {
        let (port, flushes) = mock(false);
        let port = MockPort { leaves: true, ..port };
        (Driver::new(Context::create(DeviceConfig::default()).unwrap(), true, Clock::start(), port).unwrap(), flushes)
    }

    /// What the engine thread's turn standing in for a quiet poller left (the ACK of a Write
    /// a program spinning on memory waited for) waits for that program's next post, which
    /// takes it along, for `stand_in_hold_ns` at most; a post meanwhile is not held back.
    #[test]
    fn what_a_turn_standing_in_left_waits_for_the_next_post() {
        let (d, flushes) = leaving_rig();
        let hold = stand_in_hold_ns();
        assert!(!d.deferred(d.now()), "nothing owed yet");
        assert_eq!(d.stand_in(&mut d.lock_port(), d.now()), (true, true));
        let at = d.shared.left_at.load(Ordering::Relaxed);
        assert!(!d.deferred(at + hold - 1), "left for the next post");
        assert!(d.deferred(at + hold), "the program did not answer: the engine thread flushes it");
        let before = flushes.load(Ordering::Relaxed);
        d.ring(); // the program's answer: its flush takes what was left along
        assert_eq!(flushes.load(Ordering::Relaxed), before + 1);
        assert!(!d.deferred(at + hold), "nothing left");
        assert_eq!(d.shared.left_at.load(Ordering::Relaxed), 0);
        assert_eq!(d.stand_in(&mut d.lock_port(), at), (true, true));
        d.shared.rings.fetch_add(1, Ordering::SeqCst); // a post the engine thread must send
        assert!(d.deferred(at), "a post is not held back");
    }

    /// The hold on what a turn standing in left counts from the end of that turn, not from
    /// its start: a turn that lands a 64 KiB Write takes longer than the hold, and counted
    /// from its start the ACK left alone at once, ahead of the answering Write it was left
    /// for (`ib_write_lat` 64 KiB over UDP, seen in a trace of the engine thread's sends).
    #[test]
    fn the_hold_on_what_a_turn_standing_in_left_starts_when_the_turn_ends() {
        let (d, _) = leaving_rig();
        let hold = stand_in_hold_ns();
        let ended = d.now();
        // The turn began two holds before it ended (the time it was handed is its start).
        let began = ended.saturating_sub(2 * hold);
        assert_eq!(d.stand_in(&mut d.lock_port(), began), (true, true));
        assert!(d.shared.left_at.load(Ordering::Relaxed) >= ended);
        assert!(!d.deferred(ended + hold / 2), "held from the turn's end");
    }

    /// A doorbell leaves its flush to a poller that just ran a turn (busy-poll, a link whose
    /// flush is a system call), but not while the engine thread sleeps in `ppoll`: if that
    /// poller then polls another device's CQ, nobody would send the post until the engine
    /// thread's idle wake (50 ms a round trip, seen with one thread driving two devices).
    #[test]
    fn a_doorbell_defers_to_a_spinning_poller_only_while_the_engine_thread_is_awake() {
        let r = rig(true);
        let d = &r.driver;
        assert!(!d.drive_inline(true)); // the poller's turn: it spins
        assert_ne!(d.shared.last_inline.load(Ordering::Relaxed), 0, "the turn is marked");
        // Its mark moved a second on, so that a test thread held off its core past
        // DOORBELL_DEFER before the ring still finds the poller spinning.
        d.shared.last_inline.store(d.now() + 1_000_000_000, Ordering::Relaxed);
        let before = r.flushes.load(Ordering::Relaxed);
        d.ring();
        assert_eq!(r.flushes.load(Ordering::Relaxed), before, "deferred to the poller's next turn");
        d.shared.sleeping.store(true, Ordering::SeqCst);
        d.ring();
        assert_eq!(r.flushes.load(Ordering::Relaxed), before + 1, "sent by the doorbell itself");
    }

    /// A poller's turns that owe the ACK of a request they took in keep it, and go on taking
    /// datagrams in, while the program has taken no completion since: for `ack_wait_ns`
    /// after the last datagram taken in, four times that in all. Once the program takes a
    /// completion, ACK_HOLD_TURNS more turns hold it; a post's flush takes it along.
    /// Rule PKT-ACK-13
    #[test]
    fn a_poller_waiting_for_its_own_ack_holds_the_ack_it_owes_while_taking_datagrams_in() {
        let (port, flushes) = mock(true);
        let (takes, turns) = (Arc::clone(&port.takes), Arc::clone(&port.turns));
        let d = Driver::new(Context::create(DeviceConfig::default()).unwrap(), true, Clock::start(), port).unwrap();
        let wait = ack_wait_ns();
        let poll = |t: u64| {
            d.drive_inline_at(true, Some(t));
            (flushes.load(Ordering::Relaxed), turns.load(Ordering::Relaxed))
        };
        let t0 = 1_000_000_000;
        takes.store(true, Ordering::Relaxed);
        assert_eq!(poll(t0), (1, 1), "a turn flushes, then takes a Write in");
        // The peer's ACK of our own request is still on its way: nothing is flushed, and
        // each turn takes in what came (here, more of the Write).
        assert_eq!(poll(t0 + wait / 2), (1, 2));
        assert_eq!(poll(t0 + wait / 2 + wait - 1), (1, 3), "within the wait after the last datagram");
        takes.store(false, Ordering::Relaxed);
        assert_eq!(poll(t0 + 2 * wait - 1), (1, 4), "nothing more came");
        // The program took a completion (the ACK came): ACK_HOLD_TURNS turns for its answer.
        d.shared.handed_seen.fetch_add(1, Ordering::Relaxed);
        for k in 1..=ACK_HOLD_TURNS {
            assert_eq!(poll(t0 + 2 * wait), (1, 4 + k), "held for the answer");
        }
        assert_eq!(poll(t0 + 2 * wait), (2, 5 + ACK_HOLD_TURNS), "no answer: the ACK leaves");

        // A wait that nothing ends: the ACK leaves once the wait after the last datagram
        // has passed, or once four waits have passed since it was first owed.
        let t1 = t0 + 10 * wait;
        takes.store(true, Ordering::Relaxed);
        let (f, _) = poll(t1);
        takes.store(false, Ordering::Relaxed);
        assert_eq!(poll(t1 + wait - 1).0, f, "held");
        d.shared.held.store(ACK_HOLD_TURNS, Ordering::Relaxed); // past the turns' hold too
        assert_eq!(poll(t1 + wait).0, f + 1, "the wait after the last datagram is over");
        let t2 = t1 + 10 * wait;
        takes.store(true, Ordering::Relaxed);
        let (f, _) = poll(t2);
        for k in 1..4 {
            assert_eq!(poll(t2 + k * wait - 1).0, f, "datagrams keep coming: held");
        }
        d.shared.held.store(ACK_HOLD_TURNS, Ordering::Relaxed);
        assert_eq!(poll(t2 + 4 * wait).0, f + 1, "four waits since it was owed: it leaves");

        // After a post (its doorbell rung), the next turn flushes, whatever the wait.
        let t3 = t2 + 10 * wait;
        let (f, _) = poll(t3);
        assert_eq!(poll(t3 + 1).0, f, "held");
        d.shared.rings.fetch_add(1, Ordering::SeqCst);
        assert_eq!(poll(t3 + 2).0, f + 1);
    }

    /// Where a flush is no system call (shared memory), a doorbell sends at once.
    #[test]
    fn a_doorbell_on_a_cheap_link_flushes_at_once() {
        let r = rig(false);
        assert!(!r.driver.drive_inline(true));
        let before = r.flushes.load(Ordering::Relaxed);
        r.driver.ring();
        assert_eq!(r.flushes.load(Ordering::Relaxed), before + 1);
    }

    /// A poller that polls a few times a window (UCX's progress thread) does not spin: the
    /// busy-poll engine thread does not nap for it; one that polls on every pass does.
    #[test]
    fn an_occasional_poller_is_not_a_spinning_one() {
        let w = POLL_WINDOW.as_nanos() as u64;
        let mut r = PollRate::default();
        assert!(r.spins(0, 0), "before a whole window, as before");
        assert!(!r.spins(w, 3), "3 polls in a window");
        assert!(!r.spins(w + w / 2, 500), "the verdict holds until the window ends");
        assert!(r.spins(2 * w, 500), "497 polls in a window");
        assert!(!r.spins(3 * w, 500 + WINDOW_POLLS - 1));
        assert!(r.spins(4 * w + 7, 500 + 2 * WINDOW_POLLS - 1));
    }

    /// A nap is cut short when the port says the poller left datagrams untaken, before it
    /// begins or (on a port whose peers ring) when its descriptor becomes readable; a blind
    /// nap, or one nobody rings, runs its course.
    #[test]
    fn a_nap_ends_when_the_poller_leaves_datagrams_untaken() {
        let r = rig(false);
        let d = &r.driver;
        let napper = |n: Nap| Naps::Port(Box::new(MockNapper(n)));
        assert!(!d.nap(&mut Naps::Watch(ReadyWatch::default()), Duration::ZERO), "nothing to watch");
        assert!(d.nap(&mut napper(Nap::TakeOver), Duration::from_secs(60)), "no nap at all");
        assert!(!d.nap(&mut napper(Nap::OnBell { check: None }), Duration::ZERO), "nobody rang");
        os::eventfd_signal(d.rx_fd);
        assert!(d.nap(&mut napper(Nap::OnBell { check: None }), Duration::from_secs(60)), "a peer rang");
        os::eventfd_drain(d.rx_fd);
        let bounded = napper(Nap::OnBell { check: Some(Duration::ZERO) });
        assert!(!d.nap(&mut { bounded }, Duration::from_secs(60)), "the port's own check bounds the nap");
    }

    /// The watch's verdicts (`ReadyWatch`): the engine thread takes over from a poller that
    /// did not move and took completions last, and from one still gone since; not from one
    /// that moved, nor from one that posted or polled for nothing last (only kept from its
    /// core), nor, on the poller's own core, before it gave the core back once more.
    #[test]
    fn the_watch_takes_over_from_a_poller_that_has_what_it_waited_for() {
        // (gone at, polls, on its core, moved, just handed) -> takes over
        let table = [
            (None, 7, false, false, true, true),
            (None, 7, false, true, true, false),
            (None, 7, false, false, false, false),
            (None, 7, true, false, true, true),
            (None, 7, true, true, true, false),
            (Some(7), 7, false, false, false, true), // still gone: no watch
            (Some(7), 7, true, false, false, false), // on its core, after giving it back
            (Some(7), 7, true, false, true, true),
            (Some(6), 7, false, false, false, false),
        ];
        for (gone, polls, core, moved, handed, take) in table {
            let mut w = ReadyWatch { gone, ..ReadyWatch::default() };
            assert_eq!(w.takes_over(polls, core, moved, handed, 1), take, "{gone:?} {polls} {core} {moved} {handed}");
            assert_eq!(w.gone, take.then_some(polls));
        }
        let w = ReadyWatch { gone: Some(7), ..ReadyWatch::default() };
        assert!(w.gives_back_first(7, true), "it stood in and took the core again");
        assert!(!ReadyWatch::default().gives_back_first(7, true), "it has had its core since");
        assert!(ReadyWatch::default().gives_back_first(7, false));
    }

    /// Naps are blind until the thread takes over; then they watch while the poller is still
    /// gone, and for `WATCHFUL` after.
    #[test]
    fn naps_watch_for_a_while_after_a_take_over() {
        let mut w = ReadyWatch::default();
        assert!(!w.watches(0, 5), "blind before any take-over");
        let at = 1_000_000;
        assert!(w.takes_over(0, false, false, true, at));
        assert!(w.watches(0, at + WATCHFUL.as_nanos() as u64 * 2), "the poller is still gone");
        assert!(w.watches(1, at), "back, and watched");
        assert_eq!(w.gone, None);
        let later = at + WATCHFUL.as_nanos() as u64;
        assert!(w.watches(1, later - 1));
        assert!(!w.watches(1, later));
    }

    /// A nap on a readable descriptor, blind or watching: the engine thread takes over from
    /// a poller that took completions last and does not move, not from one that posted last.
    #[test]
    fn a_nap_takes_over_only_from_a_poller_that_took_completions_last() {
        let r = rig(true);
        let d = &r.driver;
        let mut naps = Naps::Watch(ReadyWatch::default());
        os::eventfd_signal(d.rx_fd); // a datagram waits
                                     // Ran on a CPU no thread has: this thread is never on the poller's core.
        d.shared.poller_cpu.store(u32::MAX, Ordering::Relaxed);
        let blind = Duration::from_millis(1);
        d.ring();
        assert!(!d.nap(&mut naps, blind), "it posted last");
        d.ctx.inner.handed.fetch_add(1, Ordering::Relaxed); // a poll handed it completions
        assert!(d.nap(&mut naps, blind), "it took completions last");
        // Watching now: these naps end as soon as they begin, the descriptor being readable
        // (short anyway: on a machine slow enough to pass WATCHFUL here, the last is blind).
        assert!(d.nap(&mut naps, blind), "and is still away");
        d.ring();
        assert!(!d.nap(&mut naps, blind), "back");
    }

    /// A poller that has run no turn for `poller_quiet_ns` is quiet, whatever its rate before: the
    /// engine thread stands in for it.
    #[test]
    fn a_poller_that_stopped_turning_is_quiet() {
        let r = rig(false);
        let d = &r.driver;
        assert!(!d.drive_inline(true));
        let at = d.shared.last_inline.load(Ordering::Relaxed);
        let quiet = poller_quiet_ns();
        assert!(!d.poller_quiet(at + quiet - 1));
        assert!(d.poller_quiet(at + quiet));
    }

    /// A poll that finds the port taken runs no turn but counts as a sign of life, which the
    /// engine thread takes as a poller at work (and leaves it the port).
    #[test]
    fn a_poll_that_finds_the_port_taken_is_a_sign_of_life() {
        let r = rig(true);
        let d = &r.driver;
        let held = d.lock_port();
        let before = d.shared.idle_polls.load(Ordering::Relaxed);
        assert!(!d.drive_inline(true));
        assert_eq!(d.shared.idle_polls.load(Ordering::Relaxed), before + 1);
        assert!(!d.drive_inline(false), "a doorbell's flush is no poll");
        assert_eq!(d.shared.idle_polls.load(Ordering::Relaxed), before + 1);
        drop(held);
        let now = d.now();
        assert!(d.inline_active(now, now).is_some(), "a poll seen just now: the engine thread naps");
    }
}
