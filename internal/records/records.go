// Package records defines the bootstrap server's records — its HTTP API
// (docs/PROTOCOL.md "Bootstrap"), also the values of etcd's keys: what a
// prefill rank registers (RankRecord), the instance's shape (Topology) and
// where one rank is (RankInfo). The server (bootstrap), the discovery
// clients (internal/discovery) and the rank shells (kvmanager) share them;
// a user reads them as JSON, so they are internal (issue 50).
package records

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"

	"github.com/kvbridge/kvbridge/internal/curve"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// MaxRankIndex bounds every rank index and size a record or a query names.
const MaxRankIndex = 1 << 16

var b64 = base64.StdEncoding

// RankRecord is what a prefill rank registers with PUT /v1/ranks.
type RankRecord struct {
	Instance  string `json:"instance"`
	DPRank    int    `json:"dp_rank"`
	DPSize    int    `json:"dp_size"`
	TPRank    int    `json:"tp_rank"`
	TPSize    int    `json:"tp_size"`
	PPRank    int    `json:"pp_rank"`
	PPSize    int    `json:"pp_size"`
	Endpoint  string `json:"endpoint"`
	PageSize  int    `json:"page_size"`
	DType     string `json:"dtype"`
	Compat    string `json:"compat"`
	PublicKey string `json:"curve_public_key,omitempty"`
	// Cert is the rank's identity certificate (standard base64), under
	// per-rank identity: decode ranks address their first messages to it.
	Cert string `json:"identity_cert,omitempty"`
	// Epoch is the rank process's control-plane epoch (optional): a record
	// re-published with the same endpoint but a new epoch is a restart.
	Epoch uint64 `json:"epoch,omitempty"`
	ModelFacts
}

// ModelFacts are what the rank mapping needs of the model (absent from a
// rank without a model: then one prefill rank feeds one decode rank with
// identical layouts).
type ModelFacts struct {
	Layers     int    `json:"layers,omitempty"`
	KVHeads    int    `json:"kv_heads,omitempty"`
	HeadBytes  int    `json:"head_bytes,omitempty"` // one head of one token in one region
	MLA        bool   `json:"mla,omitempty"`
	PageLayout string `json:"page_layout,omitempty"` // "NHD" or "HND"
}

// Topology is the prefill deployment's shape (GET /v1/topology).
type Topology struct {
	Instance string `json:"instance"`
	DPSize   int    `json:"dp_size"`
	TPSize   int    `json:"tp_size"`
	PPSize   int    `json:"pp_size"`
	PageSize int    `json:"page_size"`
	DType    string `json:"dtype"`
	Compat   string `json:"compat"`
	ModelFacts
}

// RankInfo is where one prefill rank is (GET /v1/ranks?dp=&tp=&pp=).
type RankInfo struct {
	Endpoint  string `json:"endpoint"`
	PublicKey string `json:"curve_public_key,omitempty"`
	Cert      string `json:"identity_cert,omitempty"` // base64, as in the record
	Epoch     uint64 `json:"epoch,omitempty"`         // the record's process, when it says
}

// CertBytes decodes Cert ("" when absent or not base64: a decode rank then
// cannot address the rank under per-rank identity, and says so).
func (r RankInfo) CertBytes() string { return certBytes(r.Cert) }

func certBytes(b64cert string) string {
	b, err := b64.DecodeString(b64cert)
	if err != nil {
		return ""
	}
	return string(b)
}

// Topology is the instance facts the record carries (what GET
// /v1/topology answers once every rank has registered).
func (r RankRecord) Topology() Topology {
	return Topology{Instance: r.Instance, DPSize: r.DPSize, TPSize: r.TPSize, PPSize: r.PPSize,
		PageSize: r.PageSize, DType: r.DType, Compat: r.Compat, ModelFacts: r.ModelFacts}
}

// Validate checks a record on its own.
func (r RankRecord) Validate() error {
	switch {
	case r.Instance == "":
		return errors.New("instance is empty")
	case len(r.Instance) > wire.MaxNameBytes || len(r.Endpoint) > wire.MaxNameBytes || len(r.DType) > wire.MaxNameBytes || len(r.Compat) > wire.MaxNameBytes:
		return fmt.Errorf("instance, endpoint, dtype and compat are limited to %d bytes", wire.MaxNameBytes)
	case r.DPSize < 1 || r.TPSize < 1 || r.PPSize < 1 || r.DPSize > MaxRankIndex || r.TPSize > MaxRankIndex || r.PPSize > MaxRankIndex:
		return fmt.Errorf("sizes dp=%d tp=%d pp=%d must be in [1, %d]", r.DPSize, r.TPSize, r.PPSize, MaxRankIndex)
	case r.DPRank < 0 || r.DPRank >= r.DPSize:
		return fmt.Errorf("dp_rank %d outside [0, %d)", r.DPRank, r.DPSize)
	case r.TPRank < 0 || r.TPRank >= r.TPSize:
		return fmt.Errorf("tp_rank %d outside [0, %d)", r.TPRank, r.TPSize)
	case r.PPRank < 0 || r.PPRank >= r.PPSize:
		return fmt.Errorf("pp_rank %d outside [0, %d)", r.PPRank, r.PPSize)
	case r.PageSize < 1:
		return fmt.Errorf("page_size %d must be at least 1", r.PageSize)
	case r.DType == "":
		return errors.New("dtype is empty")
	case r.Compat == "":
		return errors.New("compat is empty")
	case r.PublicKey != "" && !curve.ValidKey(r.PublicKey):
		return errors.New("curve_public_key is not a 40-character Z85 key")
	case len(r.Cert) > 2*wire.MaxCertBytes || (r.Cert != "" && certBytes(r.Cert) == ""):
		return fmt.Errorf("identity_cert is not a base64 certificate of at most %d bytes", wire.MaxCertBytes)
	case r.Layers < 0 || r.KVHeads < 0 || r.HeadBytes < 0 || r.Layers > MaxRankIndex || r.KVHeads > MaxRankIndex || r.HeadBytes > 1<<20:
		return fmt.Errorf("layers %d, kv_heads %d, head_bytes %d out of range", r.Layers, r.KVHeads, r.HeadBytes)
	case r.PageLayout != "" && r.PageLayout != "NHD" && r.PageLayout != "HND":
		return fmt.Errorf("page_layout %.16q is not NHD or HND", r.PageLayout)
	case (r.Layers == 0) != (r.KVHeads == 0) || (r.Layers == 0) != (r.HeadBytes == 0):
		return errors.New("layers, kv_heads and head_bytes come together (or none)")
	}
	u, err := url.Parse(r.Endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Hostname() == "" || u.Hostname() == "*" {
		return fmt.Errorf("endpoint %q is not tcp://HOST:PORT", r.Endpoint)
	}
	return nil
}
