package core

// The prefill instances' topologies a decode rank uses (the rank mapping
// of its rooms, its pull slices, the certificates its prefill ranks must
// carry) are the core's: the shell looks an instance up (I/O) and steps
// TopologyLearned; the core keeps it and decides when it is no longer
// trusted — the instance's rank vanished from its bootstrap service, or a
// prefill rank refused this rank's registration (an instance may have
// changed shape under the cached topology) — and the next room's lookup
// reads it again.

// Topology is a prefill instance's shape as its bootstrap service answers
// it (GET /v1/topology).
type Topology struct {
	Instance                   string
	DPSize, TPSize, PPSize     int
	PageSize                   int
	DType, Compat              string
	Layers, KVHeads, HeadBytes int
	MLA                        bool
	PageLayout                 string
}

// TopologyLearned is a prefill instance's topology, looked up in its
// bootstrap service (URL) by the shell (decode).
type TopologyLearned struct {
	URL  string
	Topo Topology
}

func (TopologyLearned) input() {}

// maxTopologies bounds the instances whose topology a decode rank keeps
// (a deployment has a few; past it the table starts again).
const maxTopologies = 1024

// Topology returns the topology kept for the prefill instance at url.
func (c *Core) Topology(url string) (Topology, bool) {
	if c.decodeCore == nil {
		return Topology{}, false
	}
	t, ok := c.decodeCore.topos[url]
	return t, ok
}

func (c *decodeCore) learnTopology(url string, t Topology) {
	if len(c.topos) >= maxTopologies {
		clear(c.topos)
	}
	c.topos[url] = t
}

// forgetTopology drops an instance's topology ("" for every instance).
func (c *decodeCore) forgetTopology(url string) {
	if url == "" {
		clear(c.topos)
		return
	}
	delete(c.topos, url)
}
