//! Accesses to registered memory in flight, so that Deregister (and a Reregister that moves a
//! region) can return only once no thread is still copying into or out of the memory it
//! gave up: a C program frees or unmaps the buffer as soon as `ibv_dereg_mr` returns, as it
//! may on Linux, whose rxe holds a reference on the region for each packet it works on and
//! whose `rxe_dereg_mr` waits for them.
//!
//! Every use of a region's memory by the engine re-checks its key first when the device's key
//! generation has moved (`transport::responder::Grant::bytes`, `requester::recheck_local`, the
//! responder's scatter list, the RD receive's): the check and the copy after it are one
//! access, and the thread making it has its [`Slot`] marked from before the check's generation
//! read until after the copy (an engine step marks it, and `Mr::read`/`write` and an inline
//! send's gather are accesses too: `verbs::effects`). Deregister takes the key out, moves the
//! generation, and then [`quiesce`]s: it waits for every thread whose slot was marked at that
//! moment to unmark it. An access that began later reads the new generation, re-checks, and
//! finds the key gone. No counter is shared between the threads that make accesses.
//!
//! The mark and the quiesce each write before they read the other's word (Dekker-style), so
//! one of the two sides needs a full barrier between its write and its read. An engine step
//! is a mark, twice a round trip, and a Deregister is rare: the barrier is the quiesce's, a
//! `membarrier(2)` that runs one on every thread of the process, and the mark is a plain
//! store (as liburcu's `memb` flavour has it). Where the kernel has no private expedited
//! membarrier, the mark is a store and a full fence of its own.
//!
//! A forked child has only the thread that forked: the marks of the others, frozen as they
//! were, are cleared in the child (`pthread_atfork`), and it registers for membarriers again
//! (the registration is the parent's address space's).

use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `membarrier(2)` commands (`<linux/membarrier.h>`).
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes no pointers; an unknown command or an old kernel is an error.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Whether the quiesce brings the barrier (the process is registered for private expedited
/// membarriers), so that a mark needs none: decided once, before the first slot is made, and
/// the fork handler installed with it.
fn asymmetric() -> bool {
    static ASYMMETRIC: OnceLock<bool> = OnceLock::new();
    *ASYMMETRIC.get_or_init(|| {
        // SAFETY: registers a handler with no arguments that touches only atomics.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
    })
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

/// How many threads can hold a slot at once; beyond that a thread's accesses are counted in
/// [`UNSLOTTED`].
const MAX_SLOTS: usize = 1024;

/// Every slot made, in the order they were: lock-free, so that a fork taken while another
/// thread was making one leaves nothing locked in the child.
static SLOTS: [AtomicPtr<Slot>; MAX_SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SLOTS];
/// How many of [`SLOTS`] may be set (an entry below it may still be null for a moment).
static MADE: AtomicUsize = AtomicUsize::new(0);

/// Accesses made by threads with no slot (a thread whose thread-locals are being torn down, or
/// beyond [`MAX_SLOTS`]): counted here instead, and waited for as a whole.
static UNSLOTTED: AtomicU64 = AtomicU64::new(0);

/// The slots made so far.
fn slots() -> impl Iterator<Item = &'static Slot> {
    let n = MADE.load(Ordering::Acquire).min(MAX_SLOTS);
    // SAFETY: a non-null entry is a leaked Box<Slot>, never freed.
    SLOTS[..n].iter().filter_map(|p| unsafe { p.load(Ordering::Acquire).as_ref() })
}

impl Slot {
    /// A slot for the calling thread: a free one, or a new one; None when [`MAX_SLOTS`] are
    /// held.
    pub(crate) fn take() -> Option<&'static Slot> {
        if let Some(s) =
            slots().find(|s| s.taken.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())
        {
            return Some(s);
        }
        let i = MADE.fetch_add(1, Ordering::AcqRel);
        if i >= MAX_SLOTS {
            return None;
        }
        let slot = Slot { seq: AtomicU64::new(0), asymmetric: asymmetric(), taken: AtomicBool::new(true) };
        let s: &'static Slot = Box::leak(Box::new(slot));
        SLOTS[i].store((s as *const Slot).cast_mut(), Ordering::Release);
        Some(s)
    }

    /// Gives the slot back (its thread is ending; it is not in an access).
    pub(crate) fn give_back(&self) {
        self.taken.store(false, Ordering::Release);
    }

    /// Marks the start of an access: before anything of the access reads the key generation.
    pub(crate) fn enter(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s | 1, Ordering::Relaxed);
        if self.asymmetric {
            // The quiesce's membarrier orders the store before the generation read; the
            // compiler must not move the read above it.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the quiesce's fence: one of the two sees the other's write.
            fence(Ordering::SeqCst);
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
    UNSLOTTED.fetch_add(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// [`Slot::leave`] for a thread with no slot.
pub(crate) fn leave_unslotted() {
    UNSLOTTED.fetch_sub(1, Ordering::Release);
}

/// In a forked child: the threads whose marks the slots hold are gone (the forking thread was
/// in no access: it was in `fork`). Their marks are cleared (their slots stay taken: which
/// one is the forking thread's own is its thread-local's to say), the count of unslotted
/// accesses zeroed, and the child registered for membarriers of its own.
extern "C" fn after_fork_in_child() {
    for s in slots() {
        let seq = s.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 {
            s.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        }
    }
    UNSLOTTED.store(0, Ordering::Relaxed);
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
}

/// Waits until every access in flight when it was called has ended; the caller has moved the
/// key generation since it took the key out. `own` is the caller's own slot, if it has one:
/// an access the calling thread is inside of (a verb called from within one) is not waited for.
pub(crate) fn quiesce(own: Option<&Slot>) {
    fence(Ordering::SeqCst);
    // Every other thread of the process runs a full barrier: a mark stored before it is seen
    // below; a thread that marks after it reads the generation the caller moved.
    if asymmetric() && !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) && !membarrier(MEMBARRIER_CMD_GLOBAL) {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            eprintln!("softhca: membarrier failed: a deregistration may not wait for every access in flight");
        }
    }
    let own = own.map_or(std::ptr::null(), |o| o as *const Slot);
    for s in slots().filter(|s| !std::ptr::eq(*s, own)) {
        let seq = s.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            wait_while(|| s.seq.load(Ordering::Acquire) == seq);
        }
    }
    wait_while(|| UNSLOTTED.load(Ordering::Acquire) != 0);
}

/// Waits while `busy`: yielding at first (an access is a few microseconds), then sleeping, so
/// that a caller of a higher real-time priority on the same CPU lets the access end.
fn wait_while(busy: impl Fn() -> bool) {
    let mut turns = 0u32;
    while busy() {
        if turns < 1000 {
            std::thread::yield_now();
            turns += 1;
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

/// For tests of what marks an access: whether a quiesce on another thread, started inside
/// the access `open` makes around the function it is given, returned only after that access
/// ended (the function lets it end once the quiesce is under way).
#[cfg(test)]
pub(crate) fn quiesce_waits_for(open: impl FnOnce(&mut dyn FnMut())) -> bool {
    use std::sync::Arc;
    let (started, left) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut waiter = None;
    open(&mut || {
        let (s, l) = (started.clone(), left.clone());
        waiter = Some(std::thread::spawn(move || {
            s.store(true, Ordering::Release);
            quiesce(None);
            l.load(Ordering::Acquire)
        }));
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        for _ in 0..1000 {
            std::thread::yield_now();
        }
        left.store(true, Ordering::Release);
    });
    waiter.is_some_and(|w| w.join().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// [`quiesce_waits_for`] an access `slot` marks.
    fn holds(slot: &'static Slot) -> bool {
        quiesce_waits_for(|f| {
            slot.enter();
            f();
            slot.leave();
        })
    }

    /// A quiesce waits for an access marked before it: it returns once the access leaves,
    /// and at once for the caller's own access.
    #[test]
    fn quiesce_waits_for_the_access_in_flight() {
        let slot = Slot::take().expect("a slot");
        assert!(holds(slot), "quiesce returned before the access left");
        slot.enter();
        quiesce(Some(slot)); // the caller's own access is not waited for
        slot.leave();
        slot.give_back();
    }

    /// A child forked while another thread was in an access (its mark frozen in the child,
    /// where that thread is gone) does not wait for it: the fork handler cleared the mark.
    /// Before, the child's first Deregister waited forever.
    #[test]
    fn a_forked_child_waits_for_no_thread_of_its_parent() {
        let (marked, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let holder = {
            let (marked, done) = (marked.clone(), done.clone());
            std::thread::spawn(move || {
                let slot = Slot::take().expect("a slot");
                slot.enter();
                marked.store(true, Ordering::Release);
                while !done.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                slot.leave();
                slot.give_back();
            })
        };
        while !marked.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // SAFETY: the child only runs the quiesce (atomics, a system call, yields) and exits
        // with _exit, running nothing of the parent's.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            quiesce(None);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork");
        let mut status = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // SAFETY: waits for the child just forked.
        while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
            if std::time::Instant::now() > deadline {
                // SAFETY: ends the hung child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                done.store(true, Ordering::Release);
                panic!("the child's quiesce waited for its parent's thread");
            }
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
        holder.join().unwrap();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{status:#x}");
    }

    /// The mark of a process the kernel gives no private expedited membarrier (a full barrier
    /// of its own) is waited for the same way.
    #[test]
    fn a_fenced_mark_holds_a_quiesce_too() {
        let slot: &'static Slot =
            Box::leak(Box::new(Slot { seq: AtomicU64::new(0), asymmetric: false, taken: AtomicBool::new(true) }));
        let i = MADE.fetch_add(1, Ordering::AcqRel);
        SLOTS[i].store((slot as *const Slot).cast_mut(), Ordering::Release);
        assert!(holds(slot), "quiesce returned before the access left");
        slot.give_back();
    }
}
