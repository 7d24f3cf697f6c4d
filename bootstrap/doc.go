// Package bootstrap is what a deployment sets up of kvbridge's control
// plane: the embedded HTTP bootstrap server (the prefill rank table), etcd's
// client configuration, and the deployment's credentials — the shared secret (Auth), optional CURVE
// encryption (Security) and per-rank identity (CA, RankIdentity) — with the
// environment variables operators set them with. The ranks' control loop
// that uses them (messages, envelopes, heartbeats) runs inside each rank's
// Manager (package kvmanager); it is not part of the public API.
//
// # Bootstrap server
//
// Server implements PUT and DELETE /v1/ranks, GET /v1/topology (503 until
// every prefill rank has registered), GET /v1/ranks?dp=&tp=&pp=, the room
// → DP group table (PUT and GET /v1/rooms) and GET /healthz. Writes need
// the deployment's token (Auth.BootstrapToken). Its records — what a rank
// registers, the topology and a rank's place it answers — are its HTTP
// API, JSON documented in docs/PROTOCOL.md ("Bootstrap server"); kvbridge's own
// Go types for them are internal (internal/records).
//
// # Discovery
//
// A rank's Manager dials its discovery itself (kvmanager.Config's
// BootstrapURL): http:// or https:// (the bootstrap server) or
// etcd://host:port[,host:port]/<instance>, with EtcdConfig's TLS, auth and
// lease settings (read from KVBRIDGE_ETCD_* by EtcdConfigFromEnv). Prefill
// ranks register their record there; decode ranks read the topology and
// each rank's place, and follow the records' changes where the backend
// pushes them (etcd). The clients are kvbridge's own (internal/discovery).
//
// # Credentials
//
// AuthFromEnv reads the shared secret (KVBRIDGE_SECRET,
// KVBRIDGE_SECRET_FILE) or an explicit insecure mode (KVBRIDGE_INSECURE):
// every control message is authenticated with it, and bootstrap writes
// carry its token. SecurityFromEnv reads a rank's CURVE secret key and
// allow-list (KVBRIDGE_CURVE_*): its control socket then admits only
// allow-listed peers. Under per-rank identity the operator's CA issues
// each rank a certificate (CA.Issue, written with RankIdentity.Marshal and
// CA.Marshal); a rank loads its own with IdentityFromEnv
// (KVBRIDGE_CA_FILE, KVBRIDGE_IDENTITY_FILE), and a message's sender is
// then proven, not claimed.
package bootstrap
