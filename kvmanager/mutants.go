package kvmanager

// Mutants: each bugID brings back one bug the core's design removed. A
// production build compiles none of them (mutants_off.go: bugs is an empty
// struct whose on is constant false); a build with -tags kvbmutants
// (mutants_on.go) lets a test turn them on per core, or KVBRIDGE_MUTANT
// turn one on for every core of the process — `make mutants` runs the
// package's tests once per mutant and fails if any mutant survives them.
type bugID uint8

const (
	bugAckOnClearedTombstone   bugID = 1 + iota // an ABORT on a Cleared tombstone acks drained at once
	bugFailedWriteDrains                        // a failed write counts as drained
	bugClearReleases                            // Clear ends the decode quarantine
	bugNoEarlyAbort                             // an abort before the REQUEST is not sent
	bugDropRegOnPeerDown                        // prefill forgets a registration when heartbeats fail
	bugPostIgnoresEpoch                         // writes go to the peer's current epoch
	bugRestartDropsPending                      // a restart report cancels the registration in progress
	bugRetryCachedEndpoint                      // an unanswered REGISTER is retried at the cached endpoint forever
	bugDeadPeerNotTold                          // a decode rank declared dead is not told its rooms failed
	bugAbortSentOnce                            // an ABORT sent to a known endpoint is forgotten (not re-sent to a new process)
	bugNoEpochCheck                             // a peer's new epoch is recorded but not handled as a restart
	bugNeverUnwatch                             // a peer is heartbeated forever after its last shared room
	bugNoIdleRecheck                            // a REQUEST goes to a registration nobody has heard from for long
	bugNoRetiredEpochs                          // a late message from a peer's old epoch counts as a restart back
	bugRegisterEpochLate                        // a REGISTER's epoch check waits for its metadata load (Registered)
	bugRelookupForgetsEndpoint                  // a re-check or re-lookup forgets the endpoint the rank had
	bugRefusalNotTold                           // a room refused before it was created is not aborted on its prefill ranks
	bugQuarantineNow                            // a failed decode room's quarantine deadline is now, not now+QuarantineTimeout
	bugWakeEarly                                // a room's done waiter is woken when it starts Transferring, before it is terminal
	bugNoAbortAck                               // the ABORT_ACK owed to an ABORT is forgotten when the room's last write drains
	bugRestartKeepsRooms                        // prefill keeps the rooms bound to a decode rank's old epoch when it restarts
	bugExtraRequestAccepted                     // a REQUEST beyond the room's Required count is accepted
	bugTombstoneBoundIgnored                    // MaxTombstones is not enforced
	bugNotDrainedReleases                       // decode releases pages on an ABORT_ACK with Drained false
	bugStaleStatusFails                         // a STATUS failed from another epoch than the REQUEST's fails the room
	bugPendingBoundIgnored                      // MaxPendingPerPeer is not enforced
	bugSweepMapOrder                            // Sweep fails overdue rooms in map order, not room order
	bugNoTombTrim                               // a tombstone kept past MaxTombstones while it owed is not trimmed when it settles
	bugOwedNotResent                            // owed ABORTs are not sent again while unacknowledged (a lost ABORT waits for the prefill room's deadline)
	bugOverlapAccepted                          // a REGISTER whose regions overlap is accepted
	bugRepeatAccepted                           // a REQUEST naming a destination page (or state item) twice is accepted
	bugInUseAccepted                            // a REQUEST naming a page another live room of the decode process holds is accepted
	bugDeadHolderBlocks                         // a REQUEST is refused for a page held by a room that has ended (its writes may still land: the decode rank reuses it after its quarantine, as the protocol allows)
	bugSpecRepeatAccepted                       // Decode.InitReceiver takes a spec naming a destination page twice
	bugHeldPastFinalPost                        // a decode rank's pages stay held until the room's final write completes, though it may reuse them once it saw them land
	bugChunkLayersIgnored                       // decode counts a chunk landed at its first layer group's notification
	bugNotifUnchecked                           // a notification that contradicts its chunk's earlier ones (span, positions) is counted
	bugReportUnproven                           // a failed room's load report is given before every source proved nothing else can land
	bugLayerOrderUnchecked                      // prefill takes a chunk's layer ranges out of order
	bugCount                                    // one past the last
)

var bugNames = [bugCount]string{"", "ack-on-cleared-tombstone", "failed-write-drains", "clear-releases", "no-early-abort",
	"drop-reg-on-peer-down", "post-ignores-epoch", "restart-drops-pending", "retry-cached-endpoint", "dead-peer-not-told",
	"abort-sent-once", "no-epoch-check", "never-unwatch", "no-idle-recheck", "no-retired-epochs",
	"register-epoch-late", "relookup-forgets-endpoint", "refusal-not-told",
	"quarantine-now", "wake-early", "no-abort-ack", "restart-keeps-rooms", "extra-request-accepted",
	"tombstone-bound-ignored", "not-drained-releases", "stale-status-fails", "pending-bound-ignored", "sweep-map-order", "no-tomb-trim", "owed-not-resent",
	"overlap-accepted", "repeat-accepted", "in-use-accepted", "dead-holder-blocks", "spec-repeat-accepted", "held-past-final-post",
	"chunk-layers-ignored", "notif-unchecked", "report-unproven", "layer-order-unchecked"}

func (b bugID) String() string {
	if b == 0 || b >= bugCount {
		return "none"
	}
	return bugNames[b]
}
