// Package transfer holds the types an engine describes its ranks' KV
// memory and place with: the Layout of a rank's registered regions (pages
// of every layer's K and V, aux and state items), the Model the rank
// mapping reads (heads, head bytes, page tokens, PageLayout), a rank's
// Parallel place (TP, PP, DP), and Ready, a layer's readiness for
// layer-wise sends. The writes themselves are the rank's Manager's
// (kvmanager); its worker pool is internal (internal/pool).
package transfer
