// Package etcdtest starts a real etcd server (go.etcd.io/etcd/server/v3/embed)
// inside a test process, on free loopback ports (outside the ephemeral
// range, so they stay free while it is stopped) and a temporary directory,
// and can stop and restart it on the same ports and data.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/internal/testnet"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is an embedded one-member etcd cluster.
type Server struct {
	e                  *embed.Etcd
	dir                string
	clientURL, peerURL url.URL
	// Endpoint is the client address, host:port.
	Endpoint string
}

// freePort is a loopback address on a port outside the kernel's ephemeral
// range (testnet.Port): Restart binds it again after Stop, and a port from
// that range was seen taken meanwhile by another test's connection.
func freePort() (string, error) {
	p, err := testnet.Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// startTries bounds Start's draws of ports.
const startTries = 5

// Start starts a server on free loopback ports. A port free when drawn
// may be taken before etcd binds it (another test process drawing ports
// the same way, under load: seen in make test); Start then draws new
// ones, up to startTries times.
func Start() (*Server, error) {
	var err error
	for range startTries {
		var s *Server
		if s, err = startOnce(); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return s, err
		}
	}
	return nil, err
}

// drawPort draws a port for Start (freePort; a test's to replace).
var drawPort = freePort

func startOnce() (*Server, error) {
	dir, err := os.MkdirTemp("", "kvbridge-etcd-*")
	if err != nil {
		return nil, err
	}
	c, err := drawPort()
	if err != nil {
		return nil, err
	}
	p, err := drawPort()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, clientURL: url.URL{Scheme: "http", Host: c}, peerURL: url.URL{Scheme: "http", Host: p}, Endpoint: c}
	if err := s.Restart(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Restart starts a stopped server again on its ports and data.
func (s *Server) Restart() error {
	cfg := embed.NewConfig()
	cfg.Dir = s.dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{s.clientURL}, []url.URL{s.clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{s.peerURL}, []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("etcdtest: not ready within 60 s")
	}
	s.e = e
	return nil
}

// Stop stops the server, keeping its data (no-op when stopped).
func (s *Server) Stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}
