package main

import (
	"context"
	"net"
	"net/http"
	"time"
)

// httpServer is a small HTTP surface (a shard's metrics, health and
// admin calls) served in the background.
type httpServer struct {
	srv *http.Server
	lis net.Listener
}

func serveHTTP(addr string, h http.Handler) (*httpServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &httpServer{lis: lis, srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}}
	go s.srv.Serve(lis)
	return s, nil
}

func (s *httpServer) Addr() string { return s.lis.Addr().String() }

// Close stops serving, letting calls under way finish for a second.
func (s *httpServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}
