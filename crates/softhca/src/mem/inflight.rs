//! Accesses to registered memory in flight, so that Deregister (and a Reregister that moves a
//! region) can return only once no thread is still copying into or out of the memory it
//! gave up: a C program frees or unmaps the buffer as soon as `ibv_dereg_mr` returns, as it
//! may on Linux, whose rxe holds a reference on the region for each packet it works on and
//! whose `rxe_dereg_mr` waits for them.
//!
//! Every use of a region's memory re-checks its key first when the device's key generation has
//! moved (`transport::responder::Grant::bytes`, `requester::recheck_local`, the responder's
//! scatter list): the check and the copy after it are one access, and the thread making it
//! has its [`Slot`] marked from before the check's generation read until after the copy (an
//! engine step marks it: `verbs::effects`). Deregister takes the key out, moves the
//! generation, and then [`quiesce`]s: it waits for every thread whose slot was marked at that
//! moment to unmark it. An access that began later reads the new generation, re-checks, and
//! finds the key gone. No counter is shared between the threads that make accesses.
//!
//! The mark and the quiesce each write before they read the other's word (Dekker-style), so
//! one of the two sides needs a full barrier between its write and its read. An engine step
//! is a mark, twice a round trip, and a Deregister is rare: the barrier is the quiesce's, a
//! `membarrier(2)` that runs one on every thread of the process, and the mark is a plain
//! store (as liburcu's `memb` flavour has it). Where the kernel has no private expedited
//! membarrier, the mark is a full barrier itself (an atomic swap: 20-30 ns more an 8 B Send's
//! hop over shared memory, 0.71 -> 0.74 µs).

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// `membarrier(2)` commands (`<linux/membarrier.h>`).
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes no pointers; an unknown command or an old kernel is an error.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Whether the quiesce brings the barrier (the process is registered for private expedited
/// membarriers), so that a mark needs none: decided once, before the first mark or quiesce.
fn asymmetric() -> bool {
    static ASYMMETRIC: OnceLock<bool> = OnceLock::new();
    *ASYMMETRIC.get_or_init(|| membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED))
}

/// One thread's mark: `seq` is odd while the thread is making an access. Only its thread
/// writes `seq`; a line of its own, so that marking never contends with another thread's.
#[repr(align(128))]
pub(crate) struct Slot {
    seq: AtomicU64,
    /// [`asymmetric`], at hand in the line the mark writes.
    asymmetric: bool,
    /// A thread holds this slot (a slot whose thread ended is taken by the next one).
    taken: AtomicBool,
}

/// Every slot ever made; a slot lives for the rest of the process (there are as many as
/// threads have made accesses at once).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// Accesses made by threads with no slot (a thread whose thread-locals are being torn down):
/// counted here instead, and waited for as a whole.
static UNSLOTTED: AtomicU64 = AtomicU64::new(0);

impl Slot {
    /// A slot for the calling thread: a free one, or a new one.
    pub(crate) fn take() -> &'static Slot {
        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        for s in slots.iter() {
            if s.taken.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return s;
            }
        }
        let asymmetric = asymmetric();
        let s: &'static Slot =
            Box::leak(Box::new(Slot { seq: AtomicU64::new(0), asymmetric, taken: AtomicBool::new(true) }));
        slots.push(s);
        s
    }

    /// Gives the slot back (its thread is ending; it is not in an access).
    pub(crate) fn give_back(&self) {
        self.taken.store(false, Ordering::Release);
    }

    /// Marks the start of an access: before anything of the access reads the key generation.
    pub(crate) fn enter(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        if self.asymmetric {
            // The quiesce's membarrier orders this store before the generation read; the
            // compiler must not move the read above it.
            self.seq.store(s | 1, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
        } else {
            // A swap is a full barrier: the mark is visible before the generation is read.
            self.seq.swap(s | 1, Ordering::SeqCst);
        }
    }

    /// Marks the end of the access: after its last byte.
    pub(crate) fn leave(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }
}

/// [`Slot::enter`] for a thread with no slot.
pub(crate) fn enter_unslotted() {
    UNSLOTTED.fetch_add(1, Ordering::SeqCst);
}

/// [`Slot::leave`] for a thread with no slot.
pub(crate) fn leave_unslotted() {
    UNSLOTTED.fetch_sub(1, Ordering::Release);
}

/// Waits until every access in flight when it was called has ended; the caller has moved the
/// key generation since it took the key out. `own` is the caller's own slot, if it has one:
/// an access the calling thread is inside of (a verb called from within one) is not waited for.
pub(crate) fn quiesce(own: Option<&Slot>) {
    std::sync::atomic::fence(Ordering::SeqCst);
    // Every other thread of the process runs a full barrier: a mark stored before it is seen
    // below; a thread that marks after it reads the generation the caller moved.
    if asymmetric() && !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        membarrier(MEMBARRIER_CMD_GLOBAL);
    }
    let marked: Vec<(&'static Slot, u64)> = {
        let slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .filter(|s| !own.is_some_and(|o| std::ptr::eq(o, **s)))
            .map(|s| (*s, s.seq.load(Ordering::Acquire)))
            .filter(|(_, seq)| seq & 1 == 1)
            .collect()
    };
    for (s, seq) in marked {
        while s.seq.load(Ordering::Acquire) == seq {
            std::thread::yield_now();
        }
    }
    while UNSLOTTED.load(Ordering::Acquire) != 0 {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Whether a quiesce on another thread, started while `slot` is marked, returned only after
    /// the access left (which this thread makes it do once the quiesce is under way).
    fn holds(slot: &'static Slot) -> bool {
        slot.enter();
        let (started, left) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let waiter = {
            let (started, left) = (started.clone(), left.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                quiesce(None);
                left.load(Ordering::Acquire)
            })
        };
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        for _ in 0..1000 {
            std::thread::yield_now();
        }
        left.store(true, Ordering::Release);
        slot.leave();
        waiter.join().unwrap()
    }

    /// A quiesce waits for an access marked before it: it returns once the access leaves,
    /// and at once for the caller's own access.
    #[test]
    fn quiesce_waits_for_the_access_in_flight() {
        let slot = Slot::take();
        assert!(holds(slot), "quiesce returned before the access left");
        slot.enter();
        quiesce(Some(slot)); // the caller's own access is not waited for
        slot.leave();
        slot.give_back();
    }

    /// The mark of a process the kernel gives no private expedited membarrier (a full barrier
    /// of its own) is waited for the same way.
    #[test]
    fn a_fenced_mark_holds_a_quiesce_too() {
        let slot: &'static Slot =
            Box::leak(Box::new(Slot { seq: AtomicU64::new(0), asymmetric: false, taken: AtomicBool::new(true) }));
        SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        assert!(holds(slot), "quiesce returned before the access left");
        slot.give_back();
    }
}
