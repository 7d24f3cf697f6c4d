// Package kvlayout is what a rank's KV memory looks like and how a room's
// pages map between ranks: layouts, the TP/PP rank mapping, page runs
// and the writes the core plans. It is plain Go (no cgo), shared by the
// protocol core and the transfer pool (internal/pool); its layout and
// placement types are package transfer's (public: go doc shows their
// fields).
package kvlayout
