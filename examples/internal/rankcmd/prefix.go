package rankcmd

import (
	"slices"
	"sync"
)

// prefixCache is a decode rank's cache of prompt prefixes, in whole pages:
// the KV of a finished request's whole prompt pages is kept, and a later
// prompt that starts with the same tokens receives only the rest
// (RequestSpec.Prefix: the prefill rank sends every page and kvbridge skips
// the first Prefix). Entries own their pages; an entry in use is not
// evicted; the least recently used unused ones go first.
type prefixCache struct {
	mu         sync.Mutex
	capPages   int
	pageTokens int
	used       int
	tick       uint64
	entries    []*prefixEntry
}

type prefixEntry struct {
	tokens []int // whole pages of a prompt
	pages  []uint32
	refs   int
	last   uint64
}

func newPrefixCache(capPages, pageTokens int) *prefixCache {
	return &prefixCache{capPages: capPages, pageTokens: pageTokens}
}

// lookup finds the entry sharing the most whole pages with prompt, at
// most (len(prompt)−1)/pageTokens (the prompt's last token is always
// transferred: its page carries the position the first decode step
// follows, and the room moves at least one page). It holds the entry
// until release.
func (c *prefixCache) lookup(prompt []int) (*prefixEntry, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := (len(prompt) - 1) / c.pageTokens
	var best *prefixEntry
	bestK := 0
	for _, e := range c.entries {
		k := 0
		for k < min(limit, len(e.pages)) && slices.Equal(e.tokens[k*c.pageTokens:(k+1)*c.pageTokens], prompt[k*c.pageTokens:(k+1)*c.pageTokens]) {
			k++
		}
		if k > bestK {
			best, bestK = e, k
		}
	}
	if best == nil {
		return nil, 0
	}
	c.tick++
	best.refs++
	best.last = c.tick
	return best, bestK
}

func (c *prefixCache) release(e *prefixEntry) {
	c.mu.Lock()
	e.refs--
	c.mu.Unlock()
}

// insertFreeing keeps pages (the KV of tokens, whole pages) and reports
// whether it took them; evicted entries' pages go back through free.
func (c *prefixCache) insertFreeing(tokens []int, pages []uint32, free func([]uint32)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(pages) > c.capPages {
		return false
	}
	for c.used+len(pages) > c.capPages {
		victim := -1
		for i, e := range c.entries {
			if e.refs == 0 && (victim < 0 || e.last < c.entries[victim].last) {
				victim = i
			}
		}
		if victim < 0 {
			return false
		}
		e := c.entries[victim]
		c.entries = slices.Delete(c.entries, victim, victim+1)
		c.used -= len(e.pages)
		if free != nil {
			free(e.pages)
		}
	}
	c.tick++
	c.entries = append(c.entries, &prefixEntry{tokens: slices.Clone(tokens), pages: slices.Clone(pages), last: c.tick})
	c.used += len(pages)
	return true
}
