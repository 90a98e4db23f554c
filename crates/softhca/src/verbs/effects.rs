//! What an engine step or a verb leaves for after it: the consumer's callbacks (completion and
//! asynchronous event handlers) and, from an engine step, the wake-ups it owes (a completion
//! channel's event, an asynchronous event with its descriptor and waiters).
//!
//! The transport writes CQEs during a step (a full CQ moves the QP to Error then, CQ-OVF-2),
//! but never makes a system call, signals a condition variable or runs consumer code inside
//! one: those are queued here and done once the step has returned and released its locks, by
//! the thread that drove it. Inside a verb, callbacks are queued the same way, so a handler
//! may call any verb, on the same QP or CQ included; a verb's own events are delivered at once
//! (Destroy purges the events of what it destroys, and must see them).

use std::cell::{Cell, RefCell};

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
}

thread_local! {
    static EFFECTS: Effects =
        const { Effects { open: Cell::new(false), queue: RefCell::new(Vec::new()), steps: Cell::new(0) } };
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

impl Effects {
    /// Runs `f` as a scope (and a step, if `step`): see [`scope`].
    fn run<R>(&self, step: bool, f: impl FnOnce() -> R) -> R {
        let outermost = !self.open.replace(true);
        let _close = outermost.then(|| Outermost(self));
        let r = {
            let _step = step.then(|| StepOpen::new(self));
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
