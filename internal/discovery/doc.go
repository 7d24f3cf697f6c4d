// Package discovery is the discovery clients a rank dials: the HTTP
// bootstrap server's (Client: retries transient failures with jittered
// backoff until its context ends) and etcd's (EtcdClient: leased records,
// a watch per instance), behind one Discovery interface; Dial picks one by
// the target's scheme. The server, its records and etcd's configuration
// are package bootstrap's; the Manager (kvmanager) dials these.
package discovery
