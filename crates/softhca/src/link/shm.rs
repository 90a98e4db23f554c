//! The shared-memory link (issue 13): devices in different processes of one host exchange
//! the same RoCEv2 datagrams the UDP link sends — IP header on, ICRC included, so a capture
//! tap sees real packets and every receiver checks every ICRC — through rings in shared
//! memory instead of sockets. It reuses the engine driver (`link::driver`): this file is
//! its `Port`, the rendezvous and the rings.
//!
//! # Rendezvous
//!
//! A device has an address, 127.0.0.x as on the UDP link (its GID 0 is the IPv4-mapped form),
//! and owns the inbound ring `/dev/shm/softhca-shm-<address>` (mode 0600: only the same user
//! opens it, and a sender checks the owner) and a FIFO beside it (`….bell`), its doorbell.
//! The address is [`ShmConfig::addr`], else `SOFTHCA_ADDR`, else the first 127.0.0.x whose
//! ring it can create. A ring whose owner process is alive is taken ([`io::ErrorKind::AddrInUse`]);
//! one left by a process that died is reclaimed. A sender finds a peer by the destination
//! address of each datagram and maps its ring on first use.
//!
//! # The ring
//!
//! A bounded many-producer, one-consumer queue of fixed slots (each a sequence number, a
//! length and one datagram; a short one, an ACK or a small Send, in the line of the sequence
//! number, which the owner reads first), producers from any process: a producer takes a
//! ticket from the tail, writes its slot and publishes it by moving the slot's sequence
//! number; the owner takes slots in ticket order. A full ring holds the datagram up to
//! [`PATIENCE_NS`] (flow control), then drops it (the transport's retries take over) and
//! drops the next ones that find it full at once, so a peer that stops draining never blocks
//! its senders. A producer that dies between its ticket and its publication would stall the
//! consumer at that slot: after [`STALL_NS`] the owner skips it (by compare-and-swap, so a
//! late producer cannot publish over it). Whether a ticket was taken is asked of the tail at
//! most once per `STALL_LOOK_NS`: the tail's cache line is the producers'. Nothing read from
//! the ring is trusted: a datagram is copied out (so that nothing the device checks can
//! change under it), its length bounded, and the device verifies it like any other
//! (PKT-VAL-*); a torn one fails its ICRC.
//!
//! A sender writes most long datagrams straight into the peer's slot: after two long ones in
//! a row to one peer it reserves a slot there and lets the device build the next datagram in
//! it, since a message's packets come in runs. A slot's datagram starts where a middle
//! packet's payload falls on a cache line (`DATA_AT`), and a sender asks for the next slot's
//! lines (`prefetchw`) as it takes one: what bounds this link is the drain of a packet's
//! stores into lines the owner's core read on the lap before. Where the owner's core shares
//! no cache with the sender's (told from how long a read of the ring's `head` takes:
//! `Distance`), the sender takes a datagram's CRC over its source first and then copies it in
//! whole lines (`mem::to_far_lines`). A datagram that turns out to be for another
//! peer goes there by copy, and the reserved slot is published empty (a void, which the owner
//! skips), as is one reserved when the device had nothing more to send.
//!
//! In a poller's turn the owner stops taking datagrams after a request when a response is
//! next in the ring (read from a copy of the next slot's first bytes, a hint): the
//! application sees the request's completion before the ACK behind it is processed. A
//! doorbell here sends at once: a flush is a store into the peer's ring, with no system call
//! to save by leaving it to the poller's next turn.
//!
//! # Waking a sleeping owner
//!
//! In blocking mode the owner's engine thread sleeps in `ppoll` on its FIFO. Before it sleeps
//! it sets the ring's `sleeping` word to `ASLEEP` and looks at the ring once more; a sender
//! that published into a ring whose word says so writes one byte into the FIFO
//! (Dekker-style, as the driver's own doorbell).
//!
//! While the owner's application spins on a CQ, its polls take the datagrams in and the
//! engine thread naps (`NAPPING`). A program may stop polling to spin on memory instead,
//! waiting for the Write that only its device can land (perftest's `ib_write_lat`, which
//! waited 1.4-2 ms a hop for the nap to end). A sender that published into a napping owner's
//! ring looks, three quarters of `Untaken`'s time later and again at its end, whether the
//! owner's head has passed the datagram: if not, and no application thread of the owner was
//! at its port at either look nor between them (the `beat`, counted up as each poller's turn
//! and each post's flush begins and ends, even and unchanged), the poller has stopped, and
//! the sender rings, so that the engine thread takes over (`Watch::look`). A poller still
//! polling takes the datagram in long before, one in a long turn or posting (a batch of
//! sends) shows an odd beat or a moved one, and neither costs anybody a system call. The sender reads the
//! owner's lines only when a watch is due: reading them at every turn made the owner's next
//! stores into them misses (an 8 B Send's hop, 0.93 -> 1.08 µs). The engine thread's
//! `ShmNapper` closes the gap of a nap's start, when datagrams published before the word
//! was set have no watcher.
//!
//! A program that spins on memory and answers the Write it waited for with a Write of its
//! own (`ib_write_lat`) needs no ring at all once the ACKs travel with the answers: the
//! engine thread that stood in leaves the ACK for the program's post (the driver's
//! `Port::stand_in`), and a flush that begins with a response publishes it with the Write
//! behind it (`Pair`), so that the peer, polling its CQ for that ACK, takes its next Write
//! in with it before it turns to spin on memory (20-75 -> 1.1 µs a hop).

use std::collections::hash_map::Entry;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::clock::Clock;
use super::driver::{Nap, Napper, Port, Running};
use super::{TapHandle, Taps};
use crate::transport::MAX_DATAGRAM;
use crate::verbs::{Context, DeviceConfig, Gid};
use crate::wire::icrc::{self, HeadMemo};
use crate::wire::ip::{IPV4_HEADER_LEN, UDP_HEADER_LEN};
use crate::wire::opcode::{Opcode, Operation};
use crate::wire::packet::BTH_LEN;
use crate::wire::roce::{self, Ipv4Header};

/// Slots per ring: a power of two (see `Ring::map`).
pub const RING_SLOTS: usize = 256;
const _: () = assert!(RING_SLOTS.is_power_of_two());
/// A producer that took a ticket and has not published its slot after this long is taken for
/// dead: the owner skips the slot.
pub const STALL_NS: u64 = 50_000_000;
/// How often an owner waiting on an unpublished slot asks whether a producer holds its ticket
/// (see `Ring::pop`).
const STALL_LOOK_NS: u64 = 1_000_000;
/// Datagrams taken from the ring per turn, and sent per flush.
const BATCH: usize = 64;
/// Datagrams at least this long, two in a row to one peer, are followed by one built in
/// place (`transmit_in_place`): long ones come in runs (the packets of one message), short
/// ones alone, where a bet lost would cost more than the copy it saves; and a device whose
/// QPs take turns between peers makes no bets.
const IN_PLACE_MIN: usize = 1024;
/// How long a datagram waits for room in a full peer ring before it is dropped (and counted;
/// RC retransmits it): a peer that drains slowly slows its senders down, one that stopped
/// draining costs them this long per datagram at most.
pub const PATIENCE_NS: u64 = 50_000_000;
/// A ring file still being created (no magic yet) is left alone for this long; an older one
/// was left by a creator that died.
const CREATE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// A peer whose ring could not be opened is tried again after this long.
const PEER_RETRY_NS: u64 = 10_000_000;
/// The owner's engine thread is awake (the ring header's `sleeping` word).
const AWAKE: u32 = 0;
/// It sleeps in `ppoll` on the FIFO: a sender rings after publishing.
const ASLEEP: u32 = 1;
/// It naps while the owner's poller takes the datagrams in: a sender that finds the owner has
/// taken none for [`Untaken`]'s time rings (see the module docs).
const NAPPING: u32 = 2;

/// How long after publishing into a napping owner's ring a sender rings at the earliest if
/// the owner's poller has stopped (see the module docs and [`Watch::look`]): longer than a spinning poller's gap between two
/// turns (natively mostly under a microsecond, tens of microseconds under emulation), short
/// beside the 1.4 ms hop of a program that spins on memory while the engine thread naps on.
/// 10 µs rang 4,000 times in a 2 s busy-poll `ib_write_bw` (the client's poller comes back
/// later than that now and then; each ring costs a system call and a wake-up), 30 µs 160
/// times; `ib_write_lat` 8 B over shm is 21-27 µs typical with 30 (2026-11-29, the Xeon).
#[derive(Debug, Clone, Copy)]
struct Untaken(u64);

impl Untaken {
    fn here() -> Untaken {
        Untaken(super::clock::on_this_host(30_000, 500_000))
    }
}

/// The ring format's mark and version (the last byte): a process that maps a ring of another
/// layout finds it not valid.
const MAGIC: u64 = 0x736f_6674_6863_6134; // "softhca4": short datagrams in a slot's first line

/// The ring's header, at the start of the mapping; the counters on cache lines of their own.
#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    slots: AtomicU64,
    owner_pid: AtomicU32,
    /// What the owner's engine thread does: [`AWAKE`], [`ASLEEP`] (ring its FIFO after
    /// publishing) or [`NAPPING`] (ring it if the owner leaves the ring untaken).
    sleeping: AtomicU32,
    _pad: [u8; 40],
    tail: Padded,
    head: Padded,
    /// The owner's application threads' times at the port (a poller's turn, a post's flush),
    /// counted up as each starts and ends (odd: one is there).
    beat: Padded,
}

#[repr(C, align(64))]
struct Padded(AtomicU64);

/// One slot: its sequence number (ticket `t` may write it when it equals `t`; it holds a
/// datagram for ticket `t` when it equals `t + 1`), the length (with [`SHORT`]: where the
/// datagram starts), the bytes.
#[repr(C, align(64))]
struct Slot {
    seq: AtomicU64,
    len: AtomicU32,
    /// A short datagram copied in starts here, in the line of the sequence number, so that the
    /// owner's read of the one brings the other (an 8 B Send's datagram, 52 bytes, and an ACK's,
    /// 48, fit); every other one at [`DATA_AT`].
    bytes: [u8; LONG_AT + SLOT_BYTES],
}

/// Where a slot's bytes begin: after its sequence number (8 bytes) and length (4).
const BYTES_AT: usize = 12;
/// Where a datagram that is not short starts in a slot's bytes: at [`DATA_AT`] in the slot.
const LONG_AT: usize = DATA_AT - BYTES_AT;

/// The datagrams that fit in a slot's first line after its sequence number and length.
const SHORT_MAX: usize = 64 - BYTES_AT;
/// The length's mark of a datagram that starts right after it (see [`Slot::bytes`]).
const SHORT: u32 = 1 << 31;

impl Slot {
    /// Where a datagram of the published length word `len` starts, and its length (bounded by
    /// the slot: the word is the producer's, not to be trusted).
    fn datagram(s: *const Slot, len: u32) -> (*const u8, usize) {
        let n = ((len & !SHORT) as usize).min(SLOT_BYTES);
        let at = if len & SHORT != 0 { 0 } else { LONG_AT };
        // SAFETY: `at + n` <= the size of `bytes` (`n` <= SLOT_BYTES); only the address is
        // computed here.
        (unsafe { std::ptr::addr_of!((*s).bytes).cast::<u8>().add(at) }, n)
    }
}

/// Where a slot's datagram starts in its 64-byte-aligned slot: so that the payload of a
/// datagram with IPv4, UDP and BTH headers and nothing else (a multi-packet message's middle
/// and last packets, most of a long message) starts on a cache line. The sender builds most
/// long datagrams in place and its copy of the payload then stores whole lines, one store
/// each, instead of two halves of two lines: `ib_write_bw` 64 KiB over shm, busy-poll, 7591
/// -> 8082 MiB/s, `softhca perf write --link shm` 5.95 -> 6.31 GB/s (four interleaved rounds
/// each, 2026-11-29, the Intel Xeon).
const DATA_AT: usize = 64 - (IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN);
const _: () = assert!(std::mem::offset_of!(Slot, bytes) == BYTES_AT && DATA_AT >= BYTES_AT);

const SLOT_BYTES: usize = MAX_DATAGRAM;

/// What [`Ring::next_opcode`] copies: an IPv4 header with options, the UDP header and the
/// BTH's first byte fit.
const PEEK_BYTES: usize = 80;

fn ring_len(slots: usize) -> usize {
    std::mem::size_of::<Header>() + slots * std::mem::size_of::<Slot>()
}

/// A ring mapped into this process: the owner's (to consume) or a peer's (to produce into).
struct Ring {
    base: *mut u8,
    len: usize,
    slots: usize,
}

// SAFETY: the mapping is shared memory touched only through atomics and byte copies; the
// pointer stays valid until `Drop` unmaps it, and nothing hands out references tied to a
// thread.
unsafe impl Send for Ring {}
// SAFETY: through `&Ring` a thread reaches only atomics and copies of slot bytes, whose order
// the slot protocol gives; bytes another thread or process may write meanwhile are only ever
// copied, never referenced, as between processes (`pop`, `next_opcode`). The owner's ring is
// shared by its port and the engine thread's napper, which touches atomics alone.
unsafe impl Sync for Ring {}

impl Ring {
    /// Maps `file` (already `ring_len(slots)` bytes long). `slots` is a power of two, so
    /// that a ticket's slot is a mask away (under emulation a division is a helper call, and
    /// every poll of an empty ring looks up a slot).
    fn map(file: &File, slots: usize) -> io::Result<Ring> {
        if !slots.is_power_of_two() {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let len = ring_len(slots);
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the kernel chooses the
        // address; failure is MAP_FAILED, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Ring { base: p.cast(), len, slots })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page-aligned, so aligned for it) and lives
        // as long as `self`; its fields are atomics, so shared access from other processes is
        // what they are for.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot(&self, ticket: u64) -> *mut Slot {
        let i = ticket as usize & (self.slots - 1);
        // SAFETY: `i < slots`, so the slot lies inside the mapping, after the header.
        unsafe { self.base.add(std::mem::size_of::<Header>()).cast::<Slot>().add(i) }
    }

    fn seq(&self, ticket: u64) -> &AtomicU64 {
        // SAFETY: `slot` points at a live slot of the mapping; `seq` is an atomic.
        unsafe { &(*self.slot(ticket)).seq }
    }

    /// The owner's side: a fresh ring (every slot free for its first ticket), then the magic
    /// and the owner, last.
    fn init(&self) {
        let h = self.header();
        h.tail.0.store(0, Ordering::Relaxed);
        h.head.0.store(0, Ordering::Relaxed);
        h.beat.0.store(0, Ordering::Relaxed);
        h.sleeping.store(AWAKE, Ordering::Relaxed);
        h.slots.store(self.slots as u64, Ordering::Relaxed);
        for t in 0..self.slots as u64 {
            self.seq(t).store(t, Ordering::Relaxed);
        }
        h.owner_pid.store(std::process::id(), Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// The owner closes: senders that still have the ring mapped see it gone.
    fn close(&self) {
        self.header().magic.store(0, Ordering::Release);
        self.header().owner_pid.store(0, Ordering::Release);
    }

    fn valid(&self) -> bool {
        let h = self.header();
        h.magic.load(Ordering::Acquire) == MAGIC && h.slots.load(Ordering::Relaxed) == self.slots as u64
    }

    /// A producer's side: takes the next ticket, whose slot is this producer's to write until
    /// [`Ring::commit`]; `None` when the ring is full.
    fn reserve(&self) -> Option<u64> {
        let tail = &self.header().tail.0;
        let mut t = tail.load(Ordering::Relaxed);
        // Bounded: a ring whose counters another process broke must not hold this thread.
        for _ in 0..=2 * self.slots {
            let seq = self.seq(t).load(Ordering::Acquire);
            match seq.wrapping_sub(t) as i64 {
                0 => match tail.compare_exchange_weak(t, t.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return Some(t),
                    Err(now) => t = now,
                },
                d if d < 0 => return None, // full
                _ => t = tail.load(Ordering::Relaxed),
            }
        }
        None
    }

    /// Reads `head` between two clock reads: its value and how long the read took (see
    /// [`Distance`]).
    fn time_head(&self, clock: &Clock) -> (u64, u64) {
        let t0 = clock.now();
        let head = self.header().head.0.load(Ordering::Relaxed);
        // The clock's read of the TSC is ordered after the load (the vDSO's `rdtsc_ordered`).
        let t1 = clock.now();
        (head, t1.saturating_sub(t0))
    }

    /// Asks for ticket `t`'s slot in this core's cache, writable, if its owner has emptied
    /// it: the next datagram built in place goes there, and without this its stores wait at
    /// the next locked instruction for each of the slot's lines to come from the owner's core.
    fn prefetch_for_write(&self, t: u64) {
        if self.seq(t).load(Ordering::Relaxed) != t {
            return; // still the owner's (a full ring) or someone else's: leave it be
        }
        #[cfg(target_arch = "x86_64")]
        crate::mem::prefetch_w_run(self.slot(t).cast::<u8>(), std::mem::size_of::<Slot>());
    }

    /// The data area of ticket `t`'s slot, for the producer that reserved it to build a
    /// datagram in place.
    ///
    /// # Safety
    /// `t` must come from [`Ring::reserve`] on this ring and not be committed yet, and the
    /// slice must be dropped before the commit: until then the ring's protocol gives the slot
    /// to this producer (the owner reads it only after the commit publishes it). Two things
    /// can write it meanwhile, neither of which touches memory outside the slot: a process
    /// that breaks the protocol, and, if this producer holds the slot past [`STALL_NS`] and
    /// the owner skips it, the producer that takes the slot on the ring's next lap. Either
    /// spoils only the datagram, which then fails its ICRC at the owner (or, for the first,
    /// whatever that process chose to send).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot_data(&self, t: u64) -> &mut [u8] {
        // SAFETY: the slot lies inside the mapping, which lives as long as `self`; exclusive
        // by the caller's contract.
        unsafe {
            let bytes = std::ptr::addr_of_mut!((*self.slot(t)).bytes).cast::<u8>();
            std::slice::from_raw_parts_mut(bytes.add(LONG_AT), SLOT_BYTES)
        }
    }

    /// Publishes ticket `t`'s slot holding `len` bytes built in place, at [`DATA_AT`] (0: a
    /// void the owner skips: a reservation that found nothing to send). False if the slot was
    /// taken from under a producer that stalled (see the module docs).
    fn commit(&self, t: u64, len: usize) -> bool {
        self.publish_len(t, len.min(SLOT_BYTES) as u32)
    }

    /// [`Ring::commit`] for a datagram copied in by [`Ring::write`], which wrote its length.
    fn commit_copy(&self, t: u64) -> bool {
        self.seq(t).compare_exchange(t, t.wrapping_add(1), Ordering::Release, Ordering::Relaxed).is_ok()
    }

    fn publish_len(&self, t: u64, word: u32) -> bool {
        // SAFETY: ticket `t` owns the slot until this publication; `word` is a plain store.
        unsafe { (*self.slot(t)).len.store(word, Ordering::Relaxed) };
        self.commit_copy(t)
    }

    /// A producer's side, by copy: the ticket published, `None` when the ring is full, `d`
    /// is longer than a slot or the slot was taken from under a stalled producer.
    fn push(&self, d: &[u8]) -> Option<u64> {
        let t = self.write(d)?;
        self.commit_copy(t).then_some(t)
    }

    /// [`Ring::push`] but for the commit ([`Ring::commit_copy`]), which the caller owes
    /// ticket `t` (soon: the owner waits at it for up to [`STALL_NS`], and then skips it).
    fn write(&self, d: &[u8]) -> Option<u64> {
        if d.len() > SLOT_BYTES || d.is_empty() {
            return None;
        }
        let t = self.reserve()?;
        // A short one right after its length, in the line of the sequence number.
        let (at, mark) = if d.len() <= SHORT_MAX { (0, SHORT) } else { (LONG_AT, 0) };
        // SAFETY: `t` was just reserved and is committed by the caller; `at + d.len()` stays
        // inside the slot's bytes, which the ring's protocol gives this producer until then;
        // the length is a plain store, published with the bytes by the commit.
        unsafe {
            let s = self.slot(t);
            let bytes = std::ptr::addr_of_mut!((*s).bytes).cast::<u8>();
            std::ptr::copy_nonoverlapping(d.as_ptr(), bytes.add(at), d.len());
            (*s).len.store(d.len() as u32 | mark, Ordering::Relaxed);
        }
        Some(t)
    }

    /// The owner's side: copies the next datagram into `out` and returns its length and
    /// whether the copy's ICRC is right (checked as it is copied, [`icrc::copy_checked`]);
    /// `None` when the next slot is not published. A slot left unpublished for [`STALL_NS`] while
    /// later tickets were taken is skipped (`watch` keeps when it was first seen) and counted
    /// in `skipped`.
    fn pop(
        &self,
        out: &mut [u8],
        now: u64,
        watch: &mut StallWatch,
        skipped: &mut u64,
        memo: &mut HeadMemo,
    ) -> Option<(usize, bool)> {
        let h = self.header();
        // Voids and skipped slots are passed over; at most a ring's worth of them.
        for _ in 0..=self.slots {
            let t = h.head.0.load(Ordering::Relaxed);
            let seq = self.seq(t).load(Ordering::Acquire);
            if seq == t.wrapping_add(1) {
                let s = self.slot(t);
                // SAFETY: the slot was published for ticket `t` (Acquire above); the length is
                // bounded before the copy, which stays inside the slot and `out`.
                let (n, checked) = unsafe {
                    let (src, n) = Slot::datagram(s, (*s).len.load(Ordering::Relaxed));
                    let n = n.min(out.len());
                    (n, icrc::copy_checked(&mut out[..n], src, memo))
                };
                self.seq(t).store(t.wrapping_add(self.slots as u64), Ordering::Release);
                h.head.0.store(t.wrapping_add(1), Ordering::Relaxed);
                watch.since = None;
                if n == 0 {
                    continue; // a void (see `commit`)
                }
                return Some((n, checked));
            }
            if seq != t {
                return None;
            }
            // Empty, or taken and not published: a producer at work, or one that died.
            match watch.since {
                Some((ticket, since)) if ticket == t => {
                    if now.saturating_sub(since) < STALL_NS {
                        return None;
                    }
                    let _ = self.seq(t).compare_exchange(
                        t,
                        t.wrapping_add(self.slots as u64),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    // Either we skipped it or it was published meanwhile: look again.
                    if self.seq(t).load(Ordering::Acquire) == t.wrapping_add(self.slots as u64) {
                        h.head.0.store(t.wrapping_add(1), Ordering::Relaxed);
                        watch.since = None;
                        *skipped += 1;
                    }
                    continue;
                }
                _ => {
                    // Only producers write the tail: reading it on every poll of an empty ring
                    // took its cache line from them, a miss in every publication (a tenth of
                    // a busy-polled ping-pong). Whether the ticket was taken is asked at most
                    // once per `STALL_LOOK_NS`.
                    if now < watch.next_look {
                        return None;
                    }
                    watch.next_look = now.saturating_add(STALL_LOOK_NS);
                    // Taken: the tail is past it (modular, as every ticket compare).
                    if h.tail.0.load(Ordering::Acquire).wrapping_sub(t) as i64 > 0 {
                        watch.since = Some((t, now));
                    }
                    return None;
                }
            }
        }
        None
    }

    /// The BTH opcode of the next published datagram, read from a copy of its first bytes
    /// (a hint only: nothing in the ring is trusted, and the owner checks all of a datagram
    /// when it pops it).
    fn next_opcode(&self) -> Option<Opcode> {
        let s = self.slot(self.published_head()?);
        let mut head = [0u8; PEEK_BYTES];
        // SAFETY: the slot was published for its ticket (Acquire in `published_head`); the
        // copy is bounded by the slot's data and `head`. A producer writing the slot meanwhile
        // (a dishonest one) only makes the hint wrong.
        let n = unsafe {
            let (src, n) = Slot::datagram(s, (*s).len.load(Ordering::Relaxed));
            let n = n.min(PEEK_BYTES);
            std::ptr::copy_nonoverlapping(src, head.as_mut_ptr(), n);
            n
        };
        roce::peek_opcode(&head[..n])
    }

    /// The owner's next ticket, if its slot is published (Acquire: its bytes are visible).
    fn published_head(&self) -> Option<u64> {
        let t = self.header().head.0.load(Ordering::Relaxed);
        (self.seq(t).load(Ordering::Acquire) == t.wrapping_add(1)).then_some(t)
    }

    fn has_data(&self) -> bool {
        self.published_head().is_some()
    }
}

/// The owner's watch for a producer that stalled: the ticket seen taken but unpublished and
/// since when, and when to look again.
#[derive(Debug, Default)]
struct StallWatch {
    since: Option<(u64, u64)>,
    next_look: u64,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; nothing refers to it past `self`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn ring_path(addr: Ipv4Addr) -> String {
    format!("/dev/shm/softhca-shm-{addr}")
}

fn bell_path(addr: Ipv4Addr) -> String {
    format!("/dev/shm/softhca-shm-{addr}.bell")
}

/// Whether process `pid` exists (a signal 0 reaches it, or it exists under another user).
fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 only checks; no signal is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn mkfifo(path: &str) -> io::Result<()> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated path alive for the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates the owner's ring and FIFO for `addr`, reclaiming ones a dead process left.
fn create_ring(addr: Ipv4Addr) -> io::Result<(Ring, File)> {
    for attempt in 0..2 {
        let created = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(ring_path(addr));
        match created {
            Ok(file) => {
                file.set_len(ring_len(RING_SLOTS) as u64)?;
                let ring = Ring::map(&file, RING_SLOTS)?;
                ring.init();
                let _ = std::fs::remove_file(bell_path(addr));
                mkfifo(&bell_path(addr))?;
                // Read and write: the FIFO never reports end-of-file while senders come and go.
                let bell = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                    .open(bell_path(addr))?;
                return Ok((ring, bell));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt == 0 => {
                let Ok(file) = OpenOptions::new().read(true).write(true).open(ring_path(addr)) else { continue };
                let meta = file.metadata()?;
                // A file of the wrong size, or without the magic, is being created (its
                // creator writes the magic last) or was left unfinished by one that died:
                // only an old one is taken for the latter. Mapping one of the wrong size
                // would fault past its end, so it is not mapped.
                let young = meta.modified().ok().and_then(|t| t.elapsed().ok()).is_none_or(|a| a < CREATE_GRACE);
                let owner = (meta.len() == ring_len(RING_SLOTS) as u64)
                    .then(|| Ring::map(&file, RING_SLOTS).ok())
                    .flatten()
                    .filter(Ring::valid)
                    .map(|r| r.header().owner_pid.load(Ordering::Acquire));
                let in_use = match owner {
                    Some(pid) => alive(pid),
                    None => young,
                };
                if in_use {
                    return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use", ring_path(addr))));
                }
                // Left by a process that died (or never finished creating it): reclaim.
                let _ = std::fs::remove_file(ring_path(addr));
                let _ = std::fs::remove_file(bell_path(addr));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use", ring_path(addr))))
}

/// A peer's ring, mapped to produce into, and its FIFO.
struct Peer {
    ring: Ring,
    bell: Option<File>,
    /// A datagram waited [`PATIENCE_NS`] for room in vain: until the ring takes one again,
    /// datagrams that find it full are dropped at once, so a peer that stopped draining costs
    /// the other flows one wait, not one per datagram.
    stalled: bool,
    /// Datagrams were published while its owner napped (see the module docs).
    watch: Option<Watch>,
    /// The first and the last ticket this flush published here.
    flushed: Option<(u64, u64)>,
    /// The last flush here that began with a response went on with an RDMA Write: the next
    /// such response is held for what follows it (the bet of [`Pair`]).
    pairs: bool,
    /// How far the owner's core is, for the order of the copies into its slots.
    distance: Distance,
}

/// How far the core of a peer ring's owner is from this one, told from the time a read of the
/// ring's `head` takes when the owner has moved it since the last read (its line then comes
/// from the owner's core): a sample every [`PROBE_EVERY`] datagrams built in its slots, the
/// median of the last [`DISTANCE_SAMPLES`] against [`FAR_NS`]. Where the two cores share no
/// cache (two CCDs of an AMD host; the 2-vCPU EPYC's host moves its vCPUs between such cores
/// and cores that share one), the sender's datagrams built in place take the CRC first and
/// the copy after (`mem::to_far_lines`), which stores whole lines without fetching them from
/// the owner's core first; near, the fused pass, which wins there. No samples where the link
/// clock counts the TSC itself (under emulation, or `SOFTHCA_CLOCK=tsc`): its reads are not
/// ordered after the load, and under emulation too slow to tell; [`Cores`] pins it.
#[derive(Default)]
struct Distance {
    /// Pinned by the user ([`Cores`]): no samples taken.
    pinned: bool,
    /// Datagrams built in place since the last sample.
    since: u32,
    /// `head` as the last sample read it.
    head: u64,
    samples: [u32; DISTANCE_SAMPLES],
    /// Where the next sample goes, and how many there are.
    next: usize,
    filled: usize,
    far: bool,
}

/// See [`Distance`].
const PROBE_EVERY: u32 = 64;
const DISTANCE_SAMPLES: usize = 7;
/// A median read of a line the owner moved at least this long means a far core. On the 2-vCPU
/// AMD EPYC (clock reads included), during `softhca perf write --link shm --busy-poll`: 30-40
/// ns where the vCPUs share a cache (10th to 90th percentile), 140-150 where they do not.
const FAR_NS: u64 = 90;

impl Distance {
    fn new(cores: Cores) -> Distance {
        Distance { pinned: cores != Cores::Measure, far: cores == Cores::Far, ..Distance::default() }
    }

    /// Counts a datagram built in place; whether a sample is due.
    fn due(&mut self) -> bool {
        if self.pinned {
            return false;
        }
        self.since += 1;
        if self.since < PROBE_EVERY {
            return false;
        }
        self.since = 0;
        !super::clock::counts_tsc()
    }

    /// A read of `head` that took `ns`: a sample if the owner moved it since the last one.
    fn sample(&mut self, head: u64, ns: u64) {
        if head == self.head {
            return; // unmoved: its line may have been in this core's cache all along
        }
        self.head = head;
        self.samples[self.next] = u32::try_from(ns).unwrap_or(u32::MAX);
        self.next = (self.next + 1) % DISTANCE_SAMPLES;
        self.filled = (self.filled + 1).min(DISTANCE_SAMPLES);
        if self.filled == DISTANCE_SAMPLES {
            let mut sorted = self.samples;
            sorted.sort_unstable();
            self.far = u64::from(sorted[DISTANCE_SAMPLES / 2]) >= FAR_NS;
        }
    }
}

impl Peer {
    fn published(&mut self, t: u64) {
        self.flushed = Some((self.flushed.map_or(t, |(first, _)| first), t));
    }
}

fn open_peer(addr: Ipv4Addr, cores: Cores) -> io::Result<Peer> {
    let file = OpenOptions::new().read(true).write(true).open(ring_path(addr))?;
    let meta = file.metadata()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me || meta.mode() & 0o077 != 0 || meta.len() != ring_len(RING_SLOTS) as u64 {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "not a ring of this user"));
    }
    let ring = Ring::map(&file, RING_SLOTS)?;
    if !ring.valid() || !alive(ring.header().owner_pid.load(Ordering::Acquire)) {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no live device there"));
    }
    // Opened for reading too, though only written: a FIFO with no reader left (its owner died
    // while it slept) answers a write with SIGPIPE, which kills a C program (Rust's runtime
    // ignores the signal; libc's default ends the process). With this end a reader, a dead
    // owner's bell fills and then refuses with EAGAIN, which the ring is told apart by anyway.
    let bell = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(bell_path(addr))
        .ok();
    Ok(Peer { ring, bell, stalled: false, watch: None, flushed: None, pairs: false, distance: Distance::new(cores) })
}

/// How to open a [`ShmDevice`].
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// The device's address; `None`: `SOFTHCA_ADDR`, else the first free 127.0.0.x.
    pub addr: Option<Ipv4Addr>,
    pub name: String,
    /// Spin instead of sleeping (see the UDP link's option of the same name).
    pub busy_poll: bool,
    pub taps: Taps,
    /// How far the peers' cores are; `None`: `SOFTHCA_SHM_CORES` (`near`, `far`), else
    /// measured.
    pub cores: Option<Cores>,
}

/// How far the cores of a device's peers are from its own, for the order of the copies of the
/// datagrams it builds in their rings (see `Distance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cores {
    /// Told per peer from the time its ring's lines take to come over.
    #[default]
    Measure,
    /// Sharing a cache: the copy and the CRC in one pass.
    Near,
    /// Sharing none: the CRC first, then the copy (whole lines, not fetched first).
    Far,
}

impl Cores {
    /// `SOFTHCA_SHM_CORES`: `near` or `far`; anything else measures.
    fn from_env() -> Cores {
        match std::env::var("SOFTHCA_SHM_CORES").as_deref().map(str::trim) {
            Ok("near") => Cores::Near,
            Ok("far") => Cores::Far,
            _ => Cores::Measure,
        }
    }
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig { addr: None, name: "softhca_shm".into(), busy_poll: false, taps: Taps::default(), cores: None }
    }
}

impl ShmConfig {
    pub fn addr(mut self, addr: Ipv4Addr) -> Self {
        self.addr = Some(addr);
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    pub fn busy_poll(mut self, on: bool) -> Self {
        self.busy_poll = on;
        self
    }
    pub fn tap(mut self, tap: TapHandle) -> Self {
        self.taps.push(tap);
        self
    }
    pub fn cores(mut self, cores: Cores) -> Self {
        self.cores = Some(cores);
        self
    }
}

/// The link's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmCounters {
    pub rx_datagrams: u64,
    pub tx_datagrams: u64,
    /// Dropped because the peer's ring stayed full for [`PATIENCE_NS`] (or, rarer, because
    /// this sender stalled for [`STALL_NS`] between taking a slot and publishing it, and the
    /// owner skipped the slot).
    pub tx_ring_full: u64,
    /// Times a datagram found the peer's ring full and waited.
    pub tx_ring_waits: u64,
    /// Dropped because no live device has the destination address (or it is not this user's).
    pub tx_no_peer: u64,
    /// Slots skipped because their producer stalled (died) before publishing.
    pub rx_stalled_slots: u64,
    /// Datagrams built directly in the peer's ring (no copy), and bets on the peer that were
    /// lost (the datagram went to another peer by copy, its slot void).
    pub tx_in_place: u64,
    pub tx_in_place_missed: u64,
    /// Of `tx_in_place`, those built with the CRC first and the copy after, the peer's core
    /// being far (see `Distance`).
    pub tx_in_place_far: u64,
    pub bells_rung: u64,
    /// The engine thread's naps cut short because the application's poller left datagrams
    /// untaken (see "Waking a sleeping owner").
    pub naps_cut: u64,
}

#[derive(Default)]
struct Stats {
    rx: AtomicU64,
    tx: AtomicU64,
    full: AtomicU64,
    waits: AtomicU64,
    no_peer: AtomicU64,
    stalled: AtomicU64,
    in_place: AtomicU64,
    missed: AtomicU64,
    far: AtomicU64,
    bells: AtomicU64,
}

/// Counts one on a statistic only the port's holder writes (`bump_plain`).
fn bump(c: &AtomicU64) {
    crate::transport::engine::bump_plain(c, 1);
}

/// `dst`'s peer, its ring mapped on first use (one lookup: this runs per datagram); `None`
/// while no live device of this user has that address (not tried again for
/// [`PEER_RETRY_NS`]).
fn find_peer<'a>(
    peers: &'a mut FxHashMap<Ipv4Addr, Peer>,
    missing: &mut FxHashMap<Ipv4Addr, u64>,
    dst: Ipv4Addr,
    now: u64,
    cores: Cores,
) -> Option<&'a mut Peer> {
    match peers.entry(dst) {
        Entry::Occupied(e) => Some(e.into_mut()),
        Entry::Vacant(v) => {
            if missing.get(&dst).is_some_and(|&t| now.saturating_sub(t) < PEER_RETRY_NS) {
                return None;
            }
            match open_peer(dst, cores) {
                Ok(p) => {
                    missing.remove(&dst);
                    Some(v.insert(p))
                }
                Err(_) => {
                    missing.insert(dst, now);
                    None
                }
            }
        }
    }
}

struct ShmPort {
    ctx: Context,
    /// Shared with the engine thread's [`ShmNapper`].
    ring: Arc<Ring>,
    bell: File,
    /// Looked up per datagram: hashed with FxHash, not SipHash (a quarter of a short
    /// datagram's publication).
    peers: FxHashMap<Ipv4Addr, Peer>,
    /// Peers that could not be opened, and when.
    missing: FxHashMap<Ipv4Addr, u64>,
    stall: StallWatch,
    /// The ICRC's CRC over the first headers of the datagrams lately taken in (one peer QP's
    /// request and ACK shapes in a ping-pong).
    rx_memo: HeadMemo,
    taps: Taps,
    stats: Arc<Stats>,
    /// The peers' distance, as configured (see [`Cores`]).
    cores: Cores,
    clock: Clock,
    buf: Vec<u8>,
    /// The last flush stopped at its batch limit.
    backlog: bool,
    /// The peers a flush published to (kept: no allocation per flush).
    rung: Vec<Ipv4Addr>,
    /// A datagram whose peer's ring was full: its length, its destination and since when it
    /// waits; its bytes are in `held_buf`. Nothing else leaves before it (datagram order).
    held: Option<(usize, Ipv4Addr, u64)>,
    held_buf: Vec<u8>,
    /// The peers whose napping owners are watched (see [`Peer::watch`]), and the earliest
    /// time one is due.
    watched: Vec<Ipv4Addr>,
    watch_due: u64,
    untaken: Untaken,
    /// This owner's poller's turns, as `Header::beat` shows them.
    beat: u64,
}

impl ShmPort {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Takes in a batch. In a poller's turn (`inline`) it stops after a request when a
    /// response (an ACK) is next in the ring: the application sees the request's completion
    /// (and can answer it) before the ACK is processed, as the UDP link's inline turns do. In
    /// a ping-pong the peer's answer arrives with its ACK behind it: taking the ACK in first
    /// put about a microsecond of work (under emulation) between a hop and its completion.
    fn receive(&mut self, now: u64, inline: bool) -> bool {
        // An empty ring whose stall watch is not due (see `Ring::pop`) has nothing to take:
        // the commonest answer to a busy poll, given without the landing flag's two
        // thread-local writes or a pop.
        if !self.ring.has_data() && self.stall.since.is_none() && now < self.stall.next_look {
            return false;
        }
        // This thread's two copies a packet (the ring's, then the device's into the MR) bound
        // the link: the device's asks for the next packet's lines as it lands one.
        crate::mem::landing_ahead(|| self.receive_batch(now, inline))
    }

    fn receive_batch(&mut self, now: u64, inline: bool) -> bool {
        let mut got = false;
        for _ in 0..BATCH {
            let mut skipped = 0;
            let popped = self.ring.pop(&mut self.buf, now, &mut self.stall, &mut skipped, &mut self.rx_memo);
            if skipped > 0 {
                let c = &self.stats.stalled;
                c.store(c.load(Ordering::Relaxed) + skipped, Ordering::Relaxed);
            }
            let Some((n, checked)) = popped else { break };
            got = true;
            bump(&self.stats.rx);
            let d = &self.buf[..n];
            // Only a poller's turn stops early (see above).
            let request = inline && roce::peek_opcode(d).is_some_and(|op| !op.is_response());
            for _ in 0..self.taps.copies_arriving(now, d) {
                // Nothing from the ring is trusted: the device checks everything. The ICRC was
                // checked over this copy as it was made; a datagram that failed it (or had
                // none to check) goes through the device's own check, which counts the drop.
                if checked {
                    self.ctx.receive_icrc_checked(now, d);
                } else {
                    self.ctx.receive(now, d);
                }
            }
            if request && self.ring.next_opcode().is_some_and(Opcode::is_response) {
                break;
            }
        }
        got
    }

    /// Publishes `d` (in `self.buf` or `self.held_buf`) to `dst`'s ring. `Err(())` when the
    /// ring is full and its owner alive: the caller holds the datagram. `pair` keeps the
    /// flush's leading response, whose commit waits for an RDMA Write behind it where the peer
    /// pairs (see [`Pair`]).
    fn publish(&mut self, dst: Ipv4Addr, held: bool, n: usize, now: u64, pair: &mut Pair) -> Result<(), ()> {
        // Only a flush's first two datagrams are looked at: most of a flush is `Closed`.
        let op = match pair {
            Pair::Closed => None,
            _ => roce::peek_opcode(if held { &self.held_buf[..n] } else { &self.buf[..n] }),
        };
        let write = op.and_then(Opcode::info).is_some_and(|i| i.operation == Operation::RdmaWrite);
        let leads = matches!(pair, Pair::Open) && op.is_some_and(Opcode::is_response);
        // The leading response's commit: after this datagram if this is the Write it was held
        // for, else now.
        let mut after = None;
        if let Pair::Led { dst: led, pending } = std::mem::replace(pair, Pair::Closed) {
            if led == dst {
                if let Some(p) = self.peers.get_mut(&led) {
                    p.pairs = write;
                }
            }
            match pending {
                Some(p) if led == dst && write => after = Some(p),
                Some(t) => commit_held(&self.peers, led, t),
                None => {}
            }
        }
        let hold = leads && self.peers.get(&dst).is_some_and(|p| p.pairs);
        let r = self.publish_one(dst, held, n, now, hold);
        if let Some(t) = after {
            commit_held(&self.peers, dst, t);
        }
        let t = r?;
        if leads {
            *pair = Pair::Led { dst, pending: t.filter(|_| hold) };
        }
        Ok(())
    }

    /// [`ShmPort::publish`] of one datagram: the ticket it took, if any. With `hold` it is
    /// written but not committed.
    fn publish_one(&mut self, dst: Ipv4Addr, held: bool, n: usize, now: u64, hold: bool) -> Result<Option<u64>, ()> {
        let Some(peer) = find_peer(&mut self.peers, &mut self.missing, dst, now, self.cores) else {
            bump(&self.stats.no_peer);
            return Ok(None);
        };
        if !peer.ring.valid() {
            self.peers.remove(&dst); // its owner closed it: look for a new one later
            bump(&self.stats.no_peer);
            return Ok(None);
        }
        let d = if held { &self.held_buf[..n] } else { &self.buf[..n] };
        let written = if hold { peer.ring.write(d) } else { peer.ring.push(d) };
        if let Some(t) = written {
            peer.stalled = false;
            peer.published(t);
            bump(&self.stats.tx);
            if !self.rung.contains(&dst) {
                self.rung.push(dst);
            }
            return Ok(Some(t));
        }
        if !alive(peer.ring.header().owner_pid.load(Ordering::Relaxed)) {
            self.peers.remove(&dst); // its owner died: look for a new one later
            bump(&self.stats.no_peer);
            return Ok(None);
        }
        if peer.stalled {
            bump(&self.stats.full);
            return Ok(None);
        }
        Err(())
    }

    /// Sends what the device has to send, in order, into the peers' rings; a full ring holds
    /// the datagram (and what follows it) for up to [`PATIENCE_NS`]. Returns whether anything
    /// was sent or is still waiting to be.
    fn flush_tx(&mut self, now: u64) -> bool {
        self.backlog = false;
        if self.held.is_none() && !self.ctx.may_transmit() {
            return false; // idle: every busy poll flushes first
        }
        let mut sent = false;
        self.rung.clear();
        let mut pair = Pair::Closed;
        if let Some((n, dst, since)) = self.held {
            match self.publish(dst, true, n, now, &mut pair) {
                Ok(()) => self.held = None,
                Err(()) if now.saturating_sub(since) >= PATIENCE_NS => {
                    bump(&self.stats.full);
                    self.held = None;
                    if let Some(p) = self.peers.get_mut(&dst) {
                        p.stalled = true;
                    }
                }
                Err(()) => {
                    self.backlog = true;
                    return true;
                }
            }
            sent = true;
        }
        // After two long datagrams in a row to one peer the next one is built in that peer's
        // ring (see `transmit_in_place`); the others in `buf`. A response that comes first
        // is published with what follows it (`Pair`).
        let mut streak = Streak::default();
        if self.held.is_none() {
            pair = Pair::Open;
        }
        for i in 0..BATCH {
            let mut built = None;
            if let Some(dst) = streak.bet() {
                pair.close(&self.peers);
                match self.transmit_in_place(dst, now) {
                    InPlace::Sent(n) => {
                        sent = true;
                        if i + 1 == BATCH {
                            self.backlog = true;
                        }
                        streak.sent(dst, n);
                        continue;
                    }
                    InPlace::Nothing => break,
                    InPlace::Elsewhere(n) => built = Some(n),
                    InPlace::NoRoom => {}
                }
            }
            let n = match built {
                Some(n) => n,
                None => {
                    let Some(n) = self.ctx.transmit(now, &mut self.buf) else { break };
                    if !self.taps.is_empty() {
                        self.taps.sent(now, &self.buf[..n]);
                    }
                    n
                }
            };
            if i + 1 == BATCH {
                self.backlog = true;
            }
            sent = true;
            let Ok(h) = Ipv4Header::new_checked(&self.buf[..n]) else {
                bump(&self.stats.no_peer);
                continue;
            };
            let dst = h.dst_addr();
            streak.sent(dst, n);
            if self.publish(dst, false, n, now, &mut pair).is_err() {
                bump(&self.stats.waits);
                self.held_buf[..n].copy_from_slice(&self.buf[..n]);
                self.held = Some((n, dst, now));
                self.backlog = true;
                break;
            }
        }
        pair.close(&self.peers);
        // One bell per peer per flush, only for an owner that sleeps (after publishing: the
        // owner sets its word before its last look at the ring); a napping owner is watched.
        for dst in &self.rung {
            let Some(peer) = self.peers.get_mut(dst) else { continue };
            let flushed = peer.flushed.take();
            match peer.ring.header().sleeping.load(Ordering::SeqCst) {
                ASLEEP => ring_bell(peer, &self.stats),
                NAPPING => match (&mut peer.watch, flushed) {
                    (Some(w), Some((_, last))) => w.last = (last, now),
                    (None, Some((first, last))) => {
                        let w = Watch::begin(first, last, now, self.untaken.0);
                        peer.watch = Some(w);
                        self.watched.push(*dst);
                        self.watch_due = self.watch_due.min(w.due);
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        if sent {
            self.ctx.sent();
        }
        sent
    }
}

/// A sender's watch on a napping owner: the first datagram it published since the watch
/// began and the last (ticket and when), when to look, and the owner's beat at the last look
/// if it was even (nobody at the port then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    first: (u64, u64),
    last: (u64, u64),
    due: u64,
    idle_beat: Option<u64>,
}

/// What a due [`Watch`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Look again then.
    Again(u64),
    /// Everything watched was taken: the watch ends.
    Taken,
    /// The owner's poller has stopped: ring, and the watch ends.
    Ring,
}

impl Watch {
    fn begin(first: u64, last: u64, now: u64, untaken: u64) -> Watch {
        Watch { first: (first, now), last: (last, now), due: now + Watch::first_look(untaken), idle_beat: None }
    }

    /// When the first look is due after a datagram's publication: the second, which may ring,
    /// comes a quarter of `untaken` later, at `untaken`.
    fn first_look(untaken: u64) -> u64 {
        untaken - untaken / 4
    }

    /// The watch at `now` (due), with the owner's `head` and `beat` as read now. The first
    /// datagram watched was taken and the last one was not: the watch moves on to the last
    /// one. The owner's poller has stopped if nobody is at the port (an even beat) at two
    /// looks in a row with the beat unchanged between them, the first when the datagram
    /// watched has waited three quarters of `untaken`, the second when it has waited all of
    /// it. One look alone catches a
    /// poster between two flushes: `softhca perf write --link shm --busy-poll`'s client,
    /// whose 64 KiB posts keep its poller from the ACKs for tens of microseconds, was rung
    /// 5,000 times in 2 s and lost 5-10% to its engine thread standing in.
    fn look(&mut self, head: u64, beat: u64, now: u64, untaken: u64) -> Look {
        if head > self.last.0 {
            return Look::Taken;
        }
        if head > self.first.0 {
            self.first = self.last;
            self.due = self.last.1 + Watch::first_look(untaken);
            self.idle_beat = None;
        }
        if now < self.due {
            return Look::Again(self.due);
        }
        if !beat.is_multiple_of(2) {
            // A thread is at the port: give it as long again.
            self.idle_beat = None;
            self.due = now + untaken;
        } else if self.idle_beat == Some(beat) {
            return Look::Ring;
        } else {
            // Nobody at the port now, and either this is the first look or somebody came
            // since the last: look again shortly.
            self.idle_beat = Some(beat);
            self.due = now + untaken / 4;
        }
        Look::Again(self.due)
    }
}

/// Writes one byte into `peer`'s FIFO.
fn ring_bell(peer: &Peer, stats: &Stats) {
    if let Some(bell) = &peer.bell {
        bump(&stats.bells);
        // SAFETY: writes one byte from a live buffer to an open descriptor.
        let _ = unsafe { libc::write(bell.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
}

/// A flush's first datagram when it is a response (the ACK a poller's turn left for the
/// application's answer). An owner polling its CQ for that ACK, which then spins on memory for
/// an RDMA Write (perftest's `ib_write_lat`: a Write makes no CQE at its target), took the
/// ACK alone whenever the Write behind it was not yet published, and the Write waited,
/// untaken, for a sender's watch to ring the owner's engine thread (20-75 µs a hop). Where the
/// last such response to this peer was followed by a Write (`Peer::pairs`, a bet), the
/// response is written but committed only after the Write, so that the owner, which takes a
/// ring's datagrams in ticket order, finds the two together. Not before other requests: the
/// owner would then take the response in only after the request was built and published,
/// where it could have done so meanwhile (a Send, which makes a CQE the owner polls for
/// anyway: `ib_send_lat` over shm 1.02-1.16 -> 1.21-1.27 µs, holding before every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pair {
    /// The flush has published nothing yet.
    Open,
    /// It began with a response to `dst`, written but not committed if `pending` (its
    /// ticket).
    Led { dst: Ipv4Addr, pending: Option<u64> },
    /// Nothing is held.
    Closed,
}

impl Pair {
    /// Commits what is held; nothing more will be.
    fn close(&mut self, peers: &FxHashMap<Ipv4Addr, Peer>) {
        if let Pair::Led { dst, pending: Some(t) } = std::mem::replace(self, Pair::Closed) {
            commit_held(peers, dst, t);
        }
    }
}

/// Commits ticket `t` of `dst`'s ring, a response [`Pair`] held.
fn commit_held(peers: &FxHashMap<Ipv4Addr, Peer>, dst: Ipv4Addr, t: u64) {
    if let Some(peer) = peers.get(&dst) {
        peer.ring.commit_copy(t);
    }
}

/// The long datagrams a flush sent in a row to one peer: the bet of `transmit_in_place`.
#[derive(Default)]
struct Streak(Option<(Ipv4Addr, u32)>);

impl Streak {
    fn sent(&mut self, dst: Ipv4Addr, len: usize) {
        let run = match self.0 {
            _ if len < IN_PLACE_MIN => 0,
            Some((peer, k)) if peer == dst => k + 1,
            _ => 1,
        };
        self.0 = Some((dst, run));
    }

    /// The peer the next datagram is bet on: two long ones in a row went there.
    fn bet(&self) -> Option<Ipv4Addr> {
        self.0.filter(|&(_, k)| k >= 2).map(|(peer, _)| peer)
    }
}

/// What [`ShmPort::transmit_in_place`] did.
enum InPlace {
    /// A datagram of `.0` bytes went into the peer's ring.
    Sent(usize),
    /// The device had nothing to send (the reserved slot was published void).
    Nothing,
    /// The datagram is for another peer: it was copied into `buf` (and shown to the taps),
    /// `.0` bytes, for the ordinary path.
    Elsewhere(usize),
    /// The peer's ring is full or gone: nothing was asked of the device.
    NoRoom,
}

/// A slot reserved for a datagram built in place: published void if it is dropped without
/// [`Reserved::commit`] (the device's transmit unwound), so that the owner is not left
/// waiting [`STALL_NS`] for it.
struct Reserved<'a> {
    ring: &'a Ring,
    ticket: u64,
    done: bool,
}

impl Reserved<'_> {
    fn commit(mut self, len: usize) -> bool {
        self.done = true;
        self.ring.commit(self.ticket, len)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.ring.commit(self.ticket, 0);
        }
    }
}

impl ShmPort {
    /// Builds the device's next datagram directly in a slot of `dst`'s ring, saving the copy
    /// from `buf` into the ring (a sixth of the sending engine's time on a long Write). The
    /// destination is known only once the datagram is built, so this is a bet that it goes
    /// where the last long ones went, as a long message's next packet does; a lost bet costs
    /// the copy after all and a void slot (as does finding nothing to send). Every commit,
    /// a void's too, counts for the peer's bell: a datagram another sender published behind
    /// this slot while it was reserved may be waiting for it.
    fn transmit_in_place(&mut self, dst: Ipv4Addr, now: u64) -> InPlace {
        let Some(peer) = self.peers.get_mut(&dst) else { return InPlace::NoRoom };
        if !peer.ring.valid() {
            return InPlace::NoRoom;
        }
        let Some(ticket) = peer.ring.reserve() else { return InPlace::NoRoom };
        peer.ring.prefetch_for_write(ticket.wrapping_add(1));
        if !self.rung.contains(&dst) {
            self.rung.push(dst);
        }
        let slot = Reserved { ring: &peer.ring, ticket, done: false };
        // SAFETY: `ticket` was just reserved and is committed (by `slot`) only after the
        // slice's last use below.
        let data = unsafe { peer.ring.slot_data(ticket) };
        let far = peer.distance.far;
        let built =
            if far { crate::mem::to_far_lines(|| self.ctx.transmit(now, data)) } else { self.ctx.transmit(now, data) };
        let Some(n) = built else {
            slot.commit(0);
            return InPlace::Nothing;
        };
        let d = &data[..n];
        if !self.taps.is_empty() {
            self.taps.sent(now, d);
        }
        if Ipv4Header::new_checked(d).is_ok_and(|h| h.dst_addr() == dst) {
            if slot.commit(n) {
                peer.stalled = false;
                peer.published(ticket);
                bump(&self.stats.tx);
                bump(&self.stats.in_place);
                if far {
                    bump(&self.stats.far);
                }
                // Sampled here, where the commit's locked instruction has just drained this
                // core's stores: a read beside the next slot's prefetches or a packet's
                // stores in flight waits for them too (near cores read far that way).
                if peer.distance.due() {
                    let (head, ns) = peer.ring.time_head(&self.clock);
                    peer.distance.sample(head, ns);
                }
            } else {
                bump(&self.stats.full);
            }
            return InPlace::Sent(n);
        }
        self.buf[..n].copy_from_slice(d);
        slot.commit(0);
        bump(&self.stats.missed);
        InPlace::Elsewhere(n)
    }
}

impl Port for ShmPort {
    fn turn(&mut self, inline: bool, now: u64) -> bool {
        let (mut worked, now) = self.take_in(inline, now);
        if !inline {
            worked |= self.flush_tx(now);
        } else {
            self.beat();
        }
        worked
    }

    /// The engine thread's turn for a poller that spins on memory: an engine turn, but what
    /// the datagrams it took in produced is left unsent, so that the ACK of the Write the
    /// program waited for leaves with its answer (see [`Port::stand_in`]). With nothing so
    /// left it flushes as an engine turn does: a post whose own flush found the port taken
    /// is sent here. Datagrams a full ring held back (`backlog`) do not wait.
    fn stand_in(&mut self, now: u64) -> (bool, bool) {
        if self.backlog {
            return (self.turn(false, now), false);
        }
        let (worked, now) = self.take_in(false, now);
        if worked && self.ctx.may_transmit() {
            return (true, true);
        }
        (self.flush_tx(now) || worked, false)
    }

    fn flush(&mut self, now: u64) -> bool {
        // An application thread's flush (a post's) is as long as a turn's, and its next
        // poll takes in what waits.
        self.beat();
        let sent = self.flush_tx(now);
        self.beat();
        sent
    }

    fn leftovers(&self) -> bool {
        self.backlog || self.ring.has_data()
    }

    fn rx_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    fn close(&mut self) {
        self.taps.flush();
        self.ring.close();
    }

    fn prepare_sleep(&mut self) -> bool {
        self.ring.header().sleeping.store(ASLEEP, Ordering::SeqCst);
        if self.ring.has_data() {
            self.ring.header().sleeping.store(AWAKE, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn napper(&self) -> Option<Box<dyn Napper>> {
        let bell = self.bell.try_clone().ok()?;
        Some(Box::new(ShmNapper { ring: Arc::clone(&self.ring), bell, untaken: self.untaken, check: None }))
    }
}

/// The engine thread's side of the owner's naps ([`Napper`]): the `sleeping` word, and the
/// FIFO drained when a sender rang.
struct ShmNapper {
    ring: Arc<Ring>,
    bell: File,
    untaken: Untaken,
    /// A nap began with datagrams waiting: the head and the beat then (see `prepare`).
    check: Option<(u64, u64)>,
}

impl Napper for ShmNapper {
    /// A nap that begins finds the datagrams published before its word was set unwatched:
    /// if some wait, the first nap is as short as a sender's watch, and the next one begins
    /// by asking what a sender would (the head and the beat where they were, and even).
    fn prepare(&mut self) -> Nap {
        let h = self.ring.header();
        let was = h.sleeping.swap(NAPPING, Ordering::SeqCst);
        if let Some((head, beat)) = self.check.take() {
            if self.ring.has_data()
                && h.head.0.load(Ordering::Relaxed) == head
                && h.beat.0.load(Ordering::Relaxed) == beat
                && beat.is_multiple_of(2)
            {
                return Nap::TakeOver;
            }
        }
        if was == NAPPING || !self.ring.has_data() {
            return Nap::OnBell { check: None };
        }
        self.check = Some((h.head.0.load(Ordering::Relaxed), h.beat.0.load(Ordering::Relaxed)));
        Nap::OnBell { check: Some(std::time::Duration::from_nanos(self.untaken.0)) }
    }

    fn end(&mut self) {
        set_awake(&self.ring, &self.bell, AWAKE);
    }
}

/// The owner's engine thread is awake again (`word` [`AWAKE`]), or a poller takes the
/// datagrams in while it sleeps ([`NAPPING`]): senders stop ringing at every publication,
/// and the bell is drained: one read of up to a FIFO's worth (64 KiB on Linux) where honest
/// senders leave a byte or a few, so a sender that keeps writing cannot hold this thread
/// here (what it leaves wakes the next sleep early, no more).
fn set_awake(ring: &Ring, bell: &File, word: u32) {
    ring.header().sleeping.store(word, Ordering::SeqCst);
    let mut b = [0u8; 4096];
    for _ in 0..16 {
        // SAFETY: reads at most `b.len()` bytes into a live buffer from the FIFO (non-blocking).
        let n = unsafe { libc::read(bell.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
        if n < b.len() as isize {
            break;
        }
    }
}

impl ShmPort {
    /// A turn up to its flush: the `sleeping` word, the watches due, the datagrams waiting and
    /// the timers. Returns whether anything happened, and the time it went by (an engine
    /// turn reads the clock again). Inlined into both callers: out of line, a poller's turn
    /// cost shm `ib_send_lat` 0.98-1.01 -> 1.03-1.10 µs and `ib_write_lat` 1.18-1.22 ->
    /// 1.26-1.32 (three interleaved rounds each, 2026-11-30).
    #[inline(always)]
    fn take_in(&mut self, inline: bool, now: u64) -> (bool, u64) {
        // The engine thread's first turn after a sleep or a nap. A poller's turn leaves a
        // nap's word to the senders that watch it, and turns a sleep's into a nap's: the
        // poller takes the datagrams in from now on, and should it stop (to spin on memory),
        // the sleeping engine thread must still be rung.
        match self.ring.header().sleeping.load(Ordering::Relaxed) {
            AWAKE => {}
            NAPPING if inline => {}
            ASLEEP if inline => set_awake(&self.ring, &self.bell, NAPPING),
            _ => set_awake(&self.ring, &self.bell, AWAKE),
        }
        if inline {
            self.beat();
        }
        if now >= self.watch_due {
            self.check_watches(now);
        }
        let now = if inline { now } else { self.now() };
        let mut worked = self.receive(now, inline);
        if self.ctx.poll_timeout().is_some_and(|t| t <= now) {
            // Work: what the timers produced (retransmissions) rings no doorbell; the next
            // flush sends it.
            self.ctx.handle_timeout(now);
            worked = true;
        }
        (worked, now)
    }

    /// A thread of this process begins or ends its time at the port, a poller's turn or a
    /// flush (see `Header::beat`).
    fn beat(&mut self) {
        self.beat += 1;
        self.ring.header().beat.0.store(self.beat, Ordering::Relaxed);
    }

    /// The napping owners this device published to whose watch is due ([`Watch::look`]).
    /// One whose poller has stopped is rung, once (the word goes back to [`AWAKE`], which its
    /// engine thread's turn confirms). A watch also ends when the owner stops napping. The
    /// owner's lines are read only here, when a watch is due.
    fn check_watches(&mut self, now: u64) {
        let (peers, stats, untaken) = (&mut self.peers, &self.stats, self.untaken.0);
        let mut next = u64::MAX;
        self.watched.retain(|dst| {
            let Some(peer) = peers.get_mut(dst) else { return false };
            let Some(mut w) = peer.watch.take() else { return false };
            if now >= w.due {
                let h = peer.ring.header();
                if h.sleeping.load(Ordering::Relaxed) != NAPPING {
                    return false;
                }
                let (head, beat) = (h.head.0.load(Ordering::Relaxed), h.beat.0.load(Ordering::Relaxed));
                match w.look(head, beat, now, untaken) {
                    Look::Again(_) => {}
                    Look::Taken => return false,
                    Look::Ring => {
                        if h.sleeping.compare_exchange(NAPPING, AWAKE, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                            ring_bell(peer, stats);
                        }
                        return false;
                    }
                }
            }
            next = next.min(w.due);
            peer.watch = Some(w);
            true
        });
        self.watch_due = next;
    }
}

/// A RoCEv2 device on the shared-memory link, with its engine. Dropping it stops the engine
/// and removes its ring; the [`Context`] stays usable but no longer moves packets.
pub struct ShmDevice {
    ctx: Context,
    addr: Ipv4Addr,
    gid: Gid,
    /// The engine driver and its thread (stopped before the ring is removed).
    engine: Running<ShmPort>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for ShmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDevice").field("name", &self.ctx.name()).field("addr", &self.addr).finish()
    }
}

impl ShmDevice {
    /// Creates the device's ring (see "Rendezvous"), the device (GID 0 = the address) and
    /// its engine.
    pub fn open(cfg: ShmConfig) -> io::Result<ShmDevice> {
        let (addr, ring, bell) = super::claim_address(
            cfg.addr,
            |a| a,
            |a| create_ring(a).map(|(r, b)| (a, r, b)),
            "every 127.0.0.x ring is in use",
        )?;
        let gid = Gid::from_ipv6(addr.to_ipv6_mapped());
        let mut dcfg = DeviceConfig::default().name(cfg.name.clone()).gid0(gid);
        dcfg.port.gid_tbl_len = super::udp::GID_TABLE_LEN;
        // Rings join two devices: no group has a third to reach.
        dcfg.attr.max_mcast_grp = 0;
        dcfg.attr.max_mcast_qp_attach = 0;
        dcfg.attr.max_total_mcast_qp_attach = 0;
        let ctx = match Context::create(dcfg) {
            Ok(c) => c,
            Err(e) => {
                remove_ring(addr);
                return Err(io::Error::other(e.to_string()));
            }
        };
        let stats = Arc::new(Stats::default());
        let clock = Clock::start();
        let port = ShmPort {
            ctx: ctx.clone(),
            ring: Arc::new(ring),
            bell,
            peers: FxHashMap::default(),
            missing: FxHashMap::default(),
            stall: StallWatch::default(),
            rx_memo: HeadMemo::default(),
            taps: cfg.taps.clone(),
            stats: stats.clone(),
            cores: cfg.cores.unwrap_or_else(Cores::from_env),
            clock,
            buf: vec![0u8; MAX_DATAGRAM],
            backlog: false,
            rung: Vec::with_capacity(8),
            held: None,
            held_buf: vec![0u8; MAX_DATAGRAM],
            watched: Vec::with_capacity(8),
            watch_due: u64::MAX,
            untaken: Untaken::here(),
            beat: 0,
        };
        let engine = match Running::start(ctx.clone(), cfg.busy_poll, clock, port, &cfg.name) {
            Ok(e) => e,
            Err(e) => {
                remove_ring(addr);
                return Err(e);
            }
        };
        Ok(ShmDevice { ctx, addr, gid, engine, stats })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }
    pub fn gid(&self) -> Gid {
        self.gid
    }
    /// Whether the device busy-polls (see [`ShmConfig::busy_poll`]).
    pub fn busy_poll(&self) -> bool {
        self.engine.link.busy()
    }

    /// Switches busy-poll mode while the device runs.
    pub fn set_busy_poll(&self, on: bool) {
        self.engine.link.set_busy_poll(on);
    }

    pub fn counters(&self) -> ShmCounters {
        let s = &self.stats;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ShmCounters {
            rx_datagrams: l(&s.rx),
            tx_datagrams: l(&s.tx),
            tx_ring_full: l(&s.full),
            tx_ring_waits: l(&s.waits),
            tx_no_peer: l(&s.no_peer),
            rx_stalled_slots: l(&s.stalled),
            tx_in_place: l(&s.in_place),
            tx_in_place_missed: l(&s.missed),
            tx_in_place_far: l(&s.far),
            bells_rung: l(&s.bells),
            naps_cut: l(&self.engine.link.wakes.naps_cut),
        }
    }
}

fn remove_ring(addr: Ipv4Addr) {
    let _ = std::fs::remove_file(ring_path(addr));
    let _ = std::fs::remove_file(bell_path(addr));
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        self.engine.shutdown();
        remove_ring(self.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Ring {
        /// [`Ring::pop`] with a memo of its own: these tests are about the ring.
        fn pop_fresh(&self, out: &mut [u8], now: u64, st: &mut StallWatch, skipped: &mut u64) -> Option<(usize, bool)> {
            self.pop(out, now, st, skipped, &mut HeadMemo::default())
        }
    }

    fn scratch(slots: usize) -> (File, Ring) {
        let f = tempfile_in_shm(slots);
        let r = Ring::map(&f, slots).unwrap();
        r.init();
        (f, r)
    }

    fn tempfile_in_shm(slots: usize) -> File {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = format!("/dev/shm/softhca-shm-test-{}-{n}-{slots}", std::process::id());
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o600).open(&path).unwrap();
        f.set_len(ring_len(slots) as u64).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }

    /// A sender's doorbell to an owner whose end of the FIFO is gone (the process died while
    /// its engine thread slept) fails quietly: a FIFO with no reader answers a write with
    /// SIGPIPE, which ends a C program that has not ignored it (Rust's runtime ignores it, so
    /// here the write would fail with EPIPE). The sender holds a reader end of its own.
    #[test]
    fn a_bell_whose_owner_is_gone_raises_no_sigpipe() {
        let addr = Ipv4Addr::new(127, 0, 77, (std::process::id() % 200) as u8 + 20);
        let (_ring, owner_bell) = create_ring(addr).unwrap();
        let peer = open_peer(addr, Cores::Measure).unwrap();
        drop(owner_bell);
        let bell = peer.bell.as_ref().unwrap();
        // SAFETY: one byte from a live buffer to an open descriptor.
        let r = unsafe { libc::write(bell.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        let err = io::Error::last_os_error().raw_os_error();
        let _ = std::fs::remove_file(ring_path(addr));
        let _ = std::fs::remove_file(bell_path(addr));
        assert!(r == 1 || err == Some(libc::EAGAIN), "write: {r}, {err:?}");
    }

    /// Draining the bell is bounded: a peer that keeps writing into the owner's FIFO (senders
    /// may open it) must not hold the owner's thread in `set_awake`, so one drain takes at
    /// most a default FIFO's worth (64 KiB); a bell holding more than that keeps the rest.
    #[test]
    fn draining_the_bell_takes_a_bounded_amount() {
        let addr = Ipv4Addr::new(127, 0, 78, (std::process::id() % 200) as u8 + 20);
        let (ring, owner_bell) = create_ring(addr).unwrap();
        let peer = open_peer(addr, Cores::Measure).unwrap();
        let fd = peer.bell.as_ref().unwrap().as_raw_fd();
        let waiting = || {
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int to a live location.
            unsafe { libc::ioctl(owner_bell.as_raw_fd(), libc::FIONREAD, &mut n) };
            n as usize
        };
        // SAFETY: F_SETPIPE_SZ takes an int; no memory is passed.
        let size = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, 256 << 10) };
        if size < 256 << 10 {
            eprintln!("SKIP: the FIFO could not be made larger than a drain ({size})");
            let _ = std::fs::remove_file(ring_path(addr));
            let _ = std::fs::remove_file(bell_path(addr));
            return;
        }
        let chunk = vec![1u8; 4096];
        while waiting() < 192 << 10 {
            // SAFETY: 4 KiB from a live buffer to an open, non-blocking FIFO.
            assert!(unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) } > 0, "size {size}");
        }
        let before = waiting();
        set_awake(&ring, &owner_bell, AWAKE);
        let after = waiting();
        let _ = std::fs::remove_file(ring_path(addr));
        let _ = std::fs::remove_file(bell_path(addr));
        assert_eq!(before - after, 64 << 10, "{before} then {after}");
        set_awake(&ring, &owner_bell, AWAKE);
        assert_eq!(waiting(), after - (64 << 10));
    }

    /// A sender's watch on a napping owner rings only once the datagram it watches has waited
    /// the whole time and no application thread of the owner was at its port at two looks
    /// in a row, nor between them; a datagram taken in moves the watch on to the last one
    /// published, or ends it.
    #[test]
    fn a_watch_rings_only_an_owner_that_left_its_datagrams() {
        let u = 12;
        // Looks at (head, beat, now), in turn, on tickets 5..=7 published at 100 and 104,
        // and what each says.
        // (head, beat, now) at a look, and what it says.
        type Seen = ((u64, u64, u64), Look);
        let cases: [(&str, &[Seen]); 8] = [
            ("nobody at the port twice: ring", &[((5, 2, 109), Look::Again(112)), ((5, 2, 112), Look::Ring)]),
            (
                "a poller's turn is on: as long again",
                &[((5, 3, 109), Look::Again(121)), ((5, 4, 121), Look::Again(124))],
            ),
            (
                "between two flushes, then nobody",
                &[((5, 2, 109), Look::Again(112)), ((5, 6, 112), Look::Again(115)), ((5, 6, 115), Look::Ring)],
            ),
            ("at the port at the second look", &[((5, 2, 109), Look::Again(112)), ((5, 3, 112), Look::Again(124))]),
            ("5 taken: watch 7, published at 104", &[((6, 2, 109), Look::Again(113))]),
            ("7 waited too", &[((6, 2, 113), Look::Again(116)), ((6, 2, 116), Look::Ring)]),
            ("all taken", &[((5, 2, 109), Look::Again(112)), ((8, 2, 112), Look::Taken)]),
            ("not due yet", &[((5, 2, 108), Look::Again(109))]),
        ];
        for (what, looks) in cases {
            let mut w = Watch::begin(5, 5, 100, u);
            w.last = (7, 104);
            for &((head, beat, now), want) in looks {
                assert_eq!(w.look(head, beat, now, u), want, "{what}: head {head} beat {beat} at {now}");
            }
        }
    }

    /// Datagrams come out in order and whole; a full ring refuses more; freed slots take more.
    #[test]
    fn the_ring_is_a_bounded_fifo() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES];
        let mut st = StallWatch::default();
        for i in 0..4u8 {
            assert!(r.push(&[i; 100]).is_some());
        }
        assert!(r.push(&[9; 100]).is_none(), "full");
        for i in 0..4u8 {
            let n = r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n).unwrap();
            assert_eq!(&out[..n], &[i; 100][..]);
        }
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), None);
        for round in 0..10u8 {
            assert!(r.push(&[round; 7]).is_some());
            assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), Some(7));
        }
        assert!(r.push(&vec![0; SLOT_BYTES + 1]).is_none(), "too long for a slot");
    }

    /// A peer's core is far once the median of the last seven reads of a `head` its owner
    /// had moved took `FAR_NS` or more; a read of an unmoved `head` is no sample, and no
    /// verdict comes before seven samples. A pinned distance takes no samples.
    #[test]
    fn the_peers_distance_is_the_median_of_moved_reads() {
        fn feed(d: &mut Distance, ns: u64) {
            let moved = d.head + 1;
            d.sample(moved, ns);
        }
        let mut d = Distance::default();
        for _ in 0..6 {
            feed(&mut d, 400);
        }
        assert!(!d.far, "six samples are no verdict");
        d.sample(d.head, 10_000);
        assert!(!d.far, "an unmoved head is no sample");
        feed(&mut d, 50);
        assert!(d.far, "median of 400 x 6 and 50");
        for _ in 0..2 {
            feed(&mut d, 50);
        }
        assert!(d.far, "three near of seven");
        feed(&mut d, FAR_NS - 1);
        assert!(!d.far, "four near of seven");
        let mut pinned = Distance::new(Cores::Far);
        assert!(pinned.far && (0..2 * PROBE_EVERY).all(|_| !pinned.due()));
        let mut near = Distance::new(Cores::Near);
        assert!(!near.far && (0..2 * PROBE_EVERY).all(|_| !near.due()));
        let mut measured = Distance::new(Cores::Measure);
        assert_eq!((0..PROBE_EVERY).filter(|_| measured.due()).count(), usize::from(!crate::link::clock::counts_tsc()));
    }

    /// A short datagram copied in lies in its slot's first line, beside the sequence number
    /// (the owner's read of the one brings the other), a longer one at `DATA_AT`; both come
    /// out whole. A length word a producer broke (the short mark with the longest length) is
    /// bounded by the slot.
    #[test]
    fn a_short_datagram_shares_its_slots_first_line() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES + 64];
        let mut st = StallWatch::default();
        for (len, at) in [(SHORT_MAX, BYTES_AT), (SHORT_MAX + 1, DATA_AT), (1, BYTES_AT), (4000, DATA_AT)] {
            let d: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let t = r.push(&d).unwrap();
            // SAFETY: the slot is published and nothing writes it meanwhile; read only, inside
            // the slot.
            let slot = unsafe { std::slice::from_raw_parts(r.slot(t).cast::<u8>(), at + len) };
            assert_eq!(&slot[at..], &d[..], "len {len}");
            assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), Some(len));
            assert_eq!(&out[..len], &d[..]);
        }
        let t = r.reserve().unwrap();
        assert!(r.publish_len(t, u32::MAX));
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), Some(SLOT_BYTES));
    }

    /// A peer on `ring`, as `open_peer` makes one, with no FIFO to ring.
    fn peer_on(ring: Ring) -> Peer {
        let distance = Distance::default();
        Peer { ring, bell: None, stalled: false, watch: None, flushed: None, pairs: false, distance }
    }

    /// A ring's slot count is a power of two (a ticket's slot is a mask away): any other is
    /// refused rather than mapped with a wrong index.
    #[test]
    fn ring_slots_are_a_power_of_two() {
        assert_eq!(Ring::map(&tempfile_in_shm(3), 3).err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    }

    /// A slot built in place is published by its commit; a void commit (a reservation that
    /// found nothing to send) is skipped by the owner, never handed out, whatever follows it.
    #[test]
    fn in_place_slots_and_voids() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES];
        let mut st = StallWatch::default();
        let t = r.reserve().unwrap();
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), None, "reserved, not yet published");
        // SAFETY: `t` is reserved and committed after the slice's last use.
        unsafe { r.slot_data(t)[..3].copy_from_slice(b"abc") };
        assert!(r.commit(t, 3));
        let void = r.reserve().unwrap();
        assert!(r.commit(void, 0));
        assert!(r.push(b"xyz!").is_some());
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), Some(3));
        assert_eq!(&out[..3], b"abc");
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), Some(4), "the void is skipped");
        assert_eq!(&out[..4], b"xyz!");
        assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).map(|(n, _)| n), None);
        assert!(!r.has_data());
        // The void's slot is free again: the ring takes four more.
        for i in 0..4u8 {
            assert!(r.push(&[i; 9]).is_some());
        }
        assert!(r.reserve().is_none(), "full");
        assert!(r.push(&[]).is_none(), "an empty datagram is never pushed (it would read as a void)");
    }

    /// The owner reads the next datagram's opcode without taking it: what the inline receive
    /// decides by (a request's completion before the ACK behind it).
    #[test]
    fn the_next_opcode_is_read_without_taking_the_datagram() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES];
        let mut st = StallWatch::default();
        let datagram = |op: u8| {
            let mut d = vec![0u8; 20 + 8 + 12 + 4];
            d[0] = 0x45; // IPv4, no options
            d[28] = op;
            d
        };
        assert_eq!(r.next_opcode(), None, "empty");
        assert!(r.push(&datagram(0x04)).is_some()); // RC Send Only
        assert!(r.push(&datagram(0x11)).is_some()); // RC Acknowledge
        let op = r.next_opcode().unwrap();
        assert!(!op.is_response(), "{op:?}");
        assert_eq!(r.next_opcode(), Some(op), "still there");
        assert!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).is_some());
        assert!(r.next_opcode().unwrap().is_response());
        assert!(r.pop_fresh(&mut out, 0, &mut st, &mut 0).is_some());
        assert_eq!(r.next_opcode(), None);
    }

    /// The engine thread's turn standing in for a quiet poller, with nothing to leave for the
    /// program's next post, sends what a post left it: the driver counts the doorbells rung
    /// before such a turn as sent. The post here finds the port taken (the test holds it, as
    /// the engine thread in its turn would), so its own flush sends nothing.
    #[test]
    fn a_stand_in_that_leaves_nothing_sends_what_was_posted() {
        use crate::types::{QpState, QpType};
        use crate::verbs::{AhAttr, QpAttr, QpInitAttr, SendWr};
        const QKEY: u32 = 0x1111;
        let dev = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 216))).unwrap();
        let ctx = dev.context().clone();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
        let dst = Ipv4Addr::new(127, 0, 0, 217);
        let ah = pd.create_ah(&AhAttr::roce(crate::types::Gid::from_ipv4(dst), 0)).unwrap();
        let mr = pd.alloc_mr(8, crate::types::Access::LOCAL_WRITE).unwrap();
        let (_f, ring) = scratch(16);
        let mut port = dev.engine.link.lock_port();
        port.peers.insert(dst, peer_on(ring));
        qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).ud(&ah, 7, QKEY)]).unwrap();
        assert_eq!(port.peers[&dst].ring.next_opcode(), None, "the post's own flush found the port taken");
        let now = port.now();
        assert_eq!(port.stand_in(now), (true, false), "nothing received, nothing left: a flush");
        assert_eq!(port.peers[&dst].ring.next_opcode().map(Opcode::value), Some(0x64), "UD Send Only");
    }

    /// A flush's leading response (an ACK) is committed after the RDMA Write behind it where
    /// the last such flush to the peer went on with a Write (the bet), so that the owner
    /// finds the two together; before anything else, and where the bet is off, at once; held
    /// and then alone, at the flush's end.
    #[test]
    fn a_leading_response_is_published_with_the_write_behind_it() {
        const ACK: u8 = 0x11;
        const WRITE: u8 = 0x0A; // RC RDMA Write Only
        const SEND: u8 = 0x04; // RC Send Only
        let dev = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 214))).unwrap();
        let mut port = dev.engine.link.lock_port();
        let (_f, ring) = scratch(16);
        let dst = Ipv4Addr::new(127, 0, 0, 215);
        port.peers.insert(dst, peer_on(ring));
        let mut out = vec![0u8; SLOT_BYTES];
        // One flush of datagrams with these opcodes; after each, the opcode the owner would
        // find next (None: nothing published yet), and at the end what it takes in, in order.
        let mut flush = |ops: &[u8]| -> (Vec<Option<u8>>, Vec<u8>) {
            let mut pair = Pair::Open;
            let mut seen = Vec::new();
            for &op in ops {
                port.buf[..44].fill(0);
                port.buf[0] = 0x45;
                port.buf[28] = op;
                port.publish(dst, false, 44, 0, &mut pair).unwrap();
                seen.push(port.peers[&dst].ring.next_opcode().map(Opcode::value));
            }
            pair.close(&port.peers);
            let ring = &port.peers[&dst].ring;
            let mut taken = Vec::new();
            while let Some((n, _)) = ring.pop_fresh(&mut out, 0, &mut StallWatch::default(), &mut 0) {
                taken.push(out[..n][28]);
            }
            (seen, taken)
        };
        // What happens, the flush's opcodes, and what the owner would find next after each.
        type Case<'a> = (&'a str, &'a [u8], &'a [Option<u8>]);
        let cases: [Case; 6] = [
            ("no bet yet: at once", &[ACK, WRITE], &[Some(ACK), Some(ACK)]),
            ("the bet: held for the Write", &[ACK, WRITE], &[None, Some(ACK)]),
            ("held, then a Send: committed before it", &[ACK, SEND], &[None, Some(ACK)]),
            ("the bet is off", &[ACK, WRITE], &[Some(ACK), Some(ACK)]),
            ("held, and alone", &[ACK], &[None]),
            ("a request leads: nothing held", &[WRITE, ACK], &[Some(WRITE), Some(WRITE)]),
        ];
        for (what, ops, want) in cases {
            let (seen, taken) = flush(ops);
            assert_eq!(seen, want, "{what}");
            assert_eq!(taken, ops, "{what}: all taken, in order");
        }
    }

    /// The ring's counters are the peers' to write. Tickets are modular: a ring whose head and
    /// tail stand at the end of the u64 range works on across the wrap, and a peer that writes
    /// the largest values there (published or not) makes no operation panic (release builds
    /// check overflow too).
    #[test]
    fn tickets_wrap_at_the_end_of_their_range() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES];
        let (mut st, mut skipped) = (StallWatch::default(), 0);
        let h = r.header();
        let start = u64::MAX - 1;
        h.head.0.store(start, Ordering::SeqCst);
        h.tail.0.store(start, Ordering::SeqCst);
        for k in 0..4 {
            r.seq(start.wrapping_add(k)).store(start.wrapping_add(k), Ordering::SeqCst);
        }
        for round in 0..3u8 {
            assert_eq!(r.push(&[round; 7]), Some(start.wrapping_add(2 * u64::from(round))));
            assert!(r.push(&[round; 9]).is_some());
            assert!(r.has_data());
            assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut skipped).map(|(n, _)| n), Some(7));
            assert_eq!(r.pop_fresh(&mut out, 0, &mut st, &mut skipped).map(|(n, _)| (n, out[0])), Some((9, round)));
        }
        assert_eq!(h.head.0.load(Ordering::SeqCst), 4);
        // A producer that took ticket u64::MAX and died is skipped across the wrap, as any.
        let (_f2, r2) = scratch(4);
        let h2 = r2.header();
        h2.head.0.store(u64::MAX, Ordering::SeqCst);
        h2.tail.0.store(0, Ordering::SeqCst);
        r2.seq(u64::MAX).store(u64::MAX, Ordering::SeqCst);
        assert!(r2.push(b"late").is_some());
        let mut st2 = StallWatch::default();
        assert_eq!(r2.pop_fresh(&mut out, 1_000, &mut st2, &mut skipped).map(|(n, _)| n), None, "a look");
        assert_eq!(r2.pop_fresh(&mut out, 1_000 + STALL_NS, &mut st2, &mut skipped).map(|(n, _)| n), Some(4));
        assert_eq!(&out[..4], b"late");
        for seq in [u64::MAX, 0] {
            h.head.0.store(u64::MAX, Ordering::SeqCst);
            h.tail.0.store(u64::MAX, Ordering::SeqCst);
            r.seq(u64::MAX).store(seq, Ordering::SeqCst);
            let _ = (r.has_data(), r.next_opcode(), r.push(b"x"));
            let _ = r.pop_fresh(&mut out, 0, &mut st, &mut skipped);
            let _ = r.pop_fresh(&mut out, u64::MAX, &mut st, &mut skipped);
        }
    }

    /// A producer that took a ticket and never published stalls the owner for STALL_NS only;
    /// if it publishes late, after the skip, its datagram is refused, never delivered.
    #[test]
    fn a_dead_producer_is_skipped() {
        let (_f, r) = scratch(4);
        let mut out = vec![0u8; SLOT_BYTES];
        let mut st = StallWatch::default();
        // A producer takes ticket 0 and dies: the tail moves, the slot stays unpublished.
        r.header().tail.0.store(1, Ordering::SeqCst);
        assert!(r.push(b"after").is_some());
        let mut skipped = 0;
        assert_eq!(r.pop_fresh(&mut out, 1_000, &mut st, &mut skipped).map(|(n, _)| n), None, "waits for ticket 0");
        assert_eq!(r.pop_fresh(&mut out, 1_000 + STALL_NS / 2, &mut st, &mut skipped).map(|(n, _)| n), None);
        assert_eq!(
            r.pop_fresh(&mut out, 1_000 + STALL_NS, &mut st, &mut skipped).map(|(n, _)| n),
            Some(5),
            "skipped ticket 0"
        );
        assert_eq!(skipped, 1);
        assert_eq!(&out[..5], b"after");
        // The late producer's publication fails: the slot is someone else's now.
        assert!(r.seq(0).compare_exchange(0, 1, Ordering::Release, Ordering::Relaxed).is_err());

        // An owner polling an empty ring asks whether a ticket was taken once per
        // STALL_LOOK_NS: a producer that dies right after a look is seen at the next one,
        // and skipped STALL_NS after that.
        let t0 = 10 * STALL_NS;
        assert_eq!(r.pop_fresh(&mut out, t0, &mut st, &mut skipped).map(|(n, _)| n), None, "empty: a look");
        r.header().tail.0.fetch_add(1, Ordering::SeqCst); // ticket 2 taken, never published
        assert!(r.push(b"later").is_some());
        assert_eq!(r.pop_fresh(&mut out, t0 + STALL_LOOK_NS / 2, &mut st, &mut skipped).map(|(n, _)| n), None);
        assert_eq!(st.since, None, "not looked at again yet");
        assert_eq!(r.pop_fresh(&mut out, t0 + STALL_LOOK_NS, &mut st, &mut skipped).map(|(n, _)| n), None);
        assert_eq!(st.since, Some((2, t0 + STALL_LOOK_NS)));
        assert_eq!(
            r.pop_fresh(&mut out, t0 + STALL_LOOK_NS + STALL_NS, &mut st, &mut skipped).map(|(n, _)| n),
            Some(5)
        );
        assert_eq!((skipped, &out[..5]), (2, &b"later"[..]));
    }
}
