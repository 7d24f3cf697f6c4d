package ucx

/*
#include <poll.h>
#include "ucx_engine.h"

// kvb_readable reports whether fd is readable now, without consuming
// anything (poll on UCX's epoll set leaves its events in place).
static int kvb_readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLERR | POLLHUP)) != 0;
}
*/
import "C"

import (
	"os"
	"syscall"
	"time"
)

// ucxWaker lets the progress goroutine sleep until the worker has an event.
// The worker's event fd (an epoll set of its transports' fds) is dup'ed
// and handed to Go's network poller, so no OS thread blocks in C. The
// progress goroutine arms the worker (ucp_worker_arm: UCS_OK only when no
// event is pending) and then asks the waker's goroutine to wait for the fd
// to become readable; it sleeps on the command channel and ready together.
//
// No wake-up is lost: the waker's goroutine checks readability with poll()
// before it parks (an event between the arm and the park is seen there),
// and the poller reports one that comes after. While a wait is asked for
// and not yet reported (waiting), the progress goroutine does not ask
// again; a readiness reported after it woke for a command is consumed at
// its next sleep, at worst one spurious pass.
type ucxWaker struct {
	f       *os.File
	rc      syscall.RawConn
	want    chan struct{}
	ready   chan struct{}
	done    chan struct{}
	waiting bool // progress goroutine only
}

// newWaker returns nil where the worker has no event fd (then the progress
// goroutine backs off with a timer).
func (u *ucx) newWaker() *ucxWaker {
	var efd C.int
	if C.kvb_efd(u.ctx, &efd) != 0 {
		return nil
	}
	fd, err := syscall.Dup(int(efd))
	if err != nil {
		return nil
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil
	}
	f := os.NewFile(uintptr(fd), "ucx-worker-efd")
	// The poller must take the fd (deadlines work only on files it polls):
	// a wait on a file it does not poll fails at once, which would turn
	// every sleep into a spin.
	if f.SetReadDeadline(time.Now().Add(time.Hour)) != nil || f.SetReadDeadline(time.Time{}) != nil {
		f.Close()
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	w := &ucxWaker{f: f, rc: rc, want: make(chan struct{}, 1), ready: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *ucxWaker) loop() {
	defer close(w.done)
	for range w.want {
		if err := w.rc.Read(func(fd uintptr) bool { return C.kvb_readable(C.int(fd)) != 0 }); err != nil {
			return // closed
		}
		signal(w.ready)
	}
}

// wait asks for the next readiness (once per report) and returns the
// channel that reports it. The worker must be armed.
func (w *ucxWaker) wait() <-chan struct{} {
	if !w.waiting {
		w.waiting = true
		w.want <- struct{}{}
	}
	return w.ready
}

// woke records that the readiness was consumed.
func (w *ucxWaker) woke() { w.waiting = false }

// close stops the waker's goroutine (before the worker is destroyed).
func (w *ucxWaker) close() {
	close(w.want)
	w.f.Close() // wakes a Read in progress with an error
	<-w.done
}

// signal makes a non-blocking wake-up on a capacity-1 channel.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
