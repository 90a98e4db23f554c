//! What an engine step or a verb leaves for after it: the consumer's callbacks (completion and
//! asynchronous event handlers) and, from an engine step, the wake-ups it owes (a completion
//! channel's event, an asynchronous event with its descriptor and waiters).
//!
//! The transport writes CQEs during a step (a full CQ moves the QP to Error then, CQ-OVF-2),
//! but never makes a system call (a thread's first step takes its slot for the accesses it
//! makes, below, which may register the process for membarriers once), signals a condition
//! variable or runs consumer code inside one: those are queued here and done once the step
//! has returned and released its locks, by the thread that drove it. Inside a verb, callbacks are queued the same way, so a handler
//! may call any verb, on the same QP or CQ included; a verb's own events are delivered at once
//! (Destroy purges the events of what it destroys, and must see them).
//!
//! A step is also an access to registered memory: the thread's slot of `mem::inflight` is
//! marked while the outermost step runs (and while a verb gathers an inline send from its
//! SGEs, [`access`]), so that Deregister returns only once no step that might still touch the
//! region's memory is running ([`quiesce`]). The slot lives beside the effects, in the one
//! thread-local a step already reads.

use std::cell::{Cell, RefCell};

use crate::mem::inflight::{self, Slot};

type Call = Box<dyn FnOnce()>;

/// One thread's effects: one thread-local, so that a scope costs one lookup (in a shared
/// library each lookup is a call to `__tls_get_addr`; a busy poll opens two scopes, and under
/// emulation three separate thread-locals' lookups were 17% of an idle poll's time).
struct Effects {
    /// A scope is open: what is queued runs when the outermost one ends.
    open: Cell<bool>,
    queue: RefCell<Vec<Call>>,
    /// Engine steps open.
    steps: Cell<u32>,
    /// Accesses to registered memory open (an engine step is one): the outermost marks this
    /// thread's slot, which Deregister waits on (`mem::inflight`).
    accesses: Cell<u32>,
    /// This thread's slot, taken at its first access and given back when the thread ends.
    slot: Cell<Option<&'static Slot>>,
}

impl Drop for Effects {
    fn drop(&mut self) {
        if let Some(s) = self.slot.get() {
            s.give_back();
        }
    }
}

thread_local! {
    static EFFECTS: Effects = const {
        Effects {
            open: Cell::new(false),
            queue: RefCell::new(Vec::new()),
            steps: Cell::new(0),
            accesses: Cell::new(0),
            slot: Cell::new(None),
        }
    };
}

/// Closes the outermost scope even if a callback panics, so later verbs do not queue forever.
struct Outermost<'a>(&'a Effects);

impl Drop for Outermost<'_> {
    fn drop(&mut self) {
        self.0.open.set(false);
        if let Ok(mut q) = self.0.queue.try_borrow_mut() {
            q.clear();
        }
    }
}

/// Leaves the step count as it was even if the step panics.
struct StepOpen<'a>(&'a Effects);

impl<'a> StepOpen<'a> {
    fn new(e: &'a Effects) -> Self {
        e.steps.set(e.steps.get() + 1);
        StepOpen(e)
    }
}

impl Drop for StepOpen<'_> {
    fn drop(&mut self) {
        self.0.steps.set(self.0.steps.get() - 1);
    }
}

/// An access to registered memory open on this thread (see [`access`]); the outermost marks
/// the thread's slot and unmarks it when dropped, a panic included.
struct AccessOpen<'a>(&'a Effects);

impl<'a> AccessOpen<'a> {
    fn new(e: &'a Effects) -> Self {
        let n = e.accesses.get();
        if n == 0 {
            if e.slot.get().is_none() {
                e.slot.set(Slot::take());
            }
            match e.slot.get() {
                Some(slot) => slot.enter(),
                None => inflight::enter_unslotted(),
            }
        }
        e.accesses.set(n + 1);
        AccessOpen(e)
    }
}

impl Drop for AccessOpen<'_> {
    fn drop(&mut self) {
        let n = self.0.accesses.get() - 1;
        self.0.accesses.set(n);
        if n == 0 {
            match self.0.slot.get() {
                Some(s) => s.leave(),
                None => inflight::leave_unslotted(),
            }
        }
    }
}

impl Effects {
    /// Runs `f` as a scope (and a step, if `step`): see [`scope`].
    fn run<R>(&self, step: bool, f: impl FnOnce() -> R) -> R {
        let outermost = !self.open.replace(true);
        let _close = outermost.then(|| Outermost(self));
        let r = {
            let _step = step.then(|| (StepOpen::new(self), AccessOpen::new(self)));
            f()
        };
        // A callback that calls verbs may queue more; they join this same loop.
        if outermost {
            // Most scopes queue nothing (every busy poll opens one): asked before taking.
            while !self.queue.borrow().is_empty() {
                let calls = std::mem::take(&mut *self.queue.borrow_mut());
                for c in calls {
                    c();
                }
            }
        }
        r
    }
}

/// Runs `f` in a scope, and as an engine step if `step`, on this thread's [`Effects`]; on a
/// thread whose thread-locals are being torn down, `f` just runs.
fn enter<R>(step: bool, f: impl FnOnce() -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    let _ = EFFECTS.try_with(|e| out = f.take().map(|f| e.run(step, f)));
    match (out, f) {
        (Some(r), _) => r,
        (None, Some(f)) if step => unslotted(f),
        (None, Some(f)) => f(),
        (None, None) => unreachable!("the scope's function ran but returned nothing"),
    }
}

/// Runs `f`; what it queues meanwhile runs after it, on this thread, once no lock is held.
/// Nested scopes hand theirs to the outermost. On a thread whose thread-locals are being torn
/// down (a verb, or the drop of a last handle, from another thread-local's destructor) there
/// is no queue: `f` runs, and what it would queue runs at once (see [`call`]).
pub(crate) fn scope<R>(f: impl FnOnce() -> R) -> R {
    enter(false, f)
}

/// Runs an engine step `f` as a [`scope`] in which wake-ups are deferred too (see [`wake`]).
pub(crate) fn step<R>(f: impl FnOnce() -> R) -> R {
    enter(true, f)
}

/// Runs `f`, which checks keys and touches the memory they grant outside an engine step (an
/// inline send's gather at its post, `Mr::read` and `write`), as one access: Deregister waits
/// for it to end (see `mem::inflight`). An engine step is such an access already.
pub(crate) fn access<R>(f: impl FnOnce() -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    let _ = EFFECTS.try_with(|e| {
        let _open = AccessOpen::new(e);
        out = f.take().map(|f| f());
    });
    match (out, f) {
        (Some(r), _) => r,
        (None, Some(f)) => unslotted(f),
        (None, None) => unreachable!("the access's function ran but returned nothing"),
    }
}

/// Runs `f` as an access of a thread whose thread-locals are being torn down.
fn unslotted<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            inflight::leave_unslotted();
        }
    }
    inflight::enter_unslotted();
    let _leave = Leave;
    f()
}

/// Waits until every access to registered memory in flight on another thread has ended (see
/// `mem::inflight`): Deregister's last step, once the key is out and the generation moved.
pub(crate) fn quiesce() {
    let own = EFFECTS.try_with(|e| e.slot.get()).ok().flatten();
    inflight::quiesce(own);
}

/// Runs `call` now when no scope is open on this thread (or its thread-locals are gone), else
/// when the outermost one ends.
pub(crate) fn call(call: impl FnOnce() + 'static) {
    let mut call = Some(call);
    let _ = EFFECTS.try_with(|e| {
        if e.open.get() {
            if let Some(c) = call.take() {
                e.queue.borrow_mut().push(Box::new(c));
            }
        }
    });
    if let Some(c) = call {
        c();
    }
}

/// Runs a wake-up `w` (an eventfd write, a condition variable signal) now, or, inside an engine
/// step, once the step is over, in the order the step raised them.
pub(crate) fn wake(w: impl FnOnce() + 'static) {
    if EFFECTS.try_with(|e| e.steps.get()).unwrap_or(0) > 0 {
        call(w);
    } else {
        w();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Inside an engine step a wake-up waits for the step's end, in order, and a callback
    /// after it; outside one it runs at once.
    #[test]
    fn wakes_wait_for_the_end_of_a_step() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        wake(move || l.borrow_mut().push("outside"));
        assert_eq!(*log.borrow(), ["outside"]);
        let l = log.clone();
        step(|| {
            let (a, b, c) = (l.clone(), l.clone(), l.clone());
            wake(move || a.borrow_mut().push("wake 1"));
            call(move || b.borrow_mut().push("callback"));
            wake(move || c.borrow_mut().push("wake 2"));
            l.borrow_mut().push("step");
        });
        assert_eq!(*log.borrow(), ["outside", "step", "wake 1", "callback", "wake 2"]);
        let l = log.clone();
        scope(|| wake(move || l.borrow_mut().push("verb")));
        assert_eq!(log.borrow().last(), Some(&"verb"));
    }

    /// An engine step, and an access outside one, is an access to registered memory:
    /// Deregister's quiesce on another thread waits for it to end (see `mem::inflight`); a
    /// scope that is neither is not waited for.
    #[test]
    fn a_step_and_an_access_hold_a_quiesce_until_they_end() {
        use crate::mem::inflight::quiesce_waits_for;
        assert!(quiesce_waits_for(|f| step(f)), "a step");
        assert!(quiesce_waits_for(|f| access(f)), "an access");
        assert!(quiesce_waits_for(|f| scope(|| step(f))), "a step inside a scope");
        // Nothing marked after the step: a quiesce returns at once.
        crate::mem::inflight::quiesce(None);
    }

    /// A scope opened inside another (a verb's step inside a poll's scope) leaves what the
    /// outer one queued for the outer one's end.
    #[test]
    fn a_nested_scope_leaves_the_queue_to_the_outermost() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let (a, b) = (log.clone(), log.clone());
        scope(|| {
            call(move || a.borrow_mut().push("outer"));
            step(|| call(move || b.borrow_mut().push("inner")));
            assert!(log.borrow().is_empty(), "ran before the outermost scope ended");
        });
        assert_eq!(*log.borrow(), ["outer", "inner"]);
    }
}
