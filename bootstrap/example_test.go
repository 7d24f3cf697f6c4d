package bootstrap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kvbridge/kvbridge/bootstrap"
)

// A bootstrap server: a prefill rank registers (PUT /v1/ranks, with the
// deployment's bearer token), and anyone reads the instance back (GET
// /v1/topology). kvbridge's ranks do this themselves (kvmanager); this is
// the server's HTTP API as an operator sees it.
func ExampleServer() {
	auth, err := bootstrap.NewAuth([]byte("the deployment's shared secret"))
	if err != nil {
		panic(err)
	}
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
	if err != nil {
		panic(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		panic(err)
	}
	defer srv.Close(context.Background())
	rec := []byte(`{"instance": "prefill-a", "dp_rank": 0, "dp_size": 1, "tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1,
		"endpoint": "tcp://127.0.0.1:17000", "page_size": 16, "dtype": "bf16", "compat": "v1:llama3-8b"}`)
	req, _ := http.NewRequest(http.MethodPut, srv.URL()+"/v1/ranks", bytes.NewReader(rec))
	req.Header.Set("Authorization", "Bearer "+auth.BootstrapToken()) // writes need it; reads do not
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	resp, err = http.Get(srv.URL() + "/v1/topology")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var topo struct {
		Instance string `json:"instance"`
		PageSize int    `json:"page_size"`
		DType    string `json:"dtype"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&topo); err != nil {
		panic(err)
	}
	fmt.Println(topo.Instance, topo.PageSize, topo.DType)
	// Output: prefill-a 16 bf16
}
