package server

import (
	"net/http"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Hooks for the external tests (package server_test), which may import
// what imports server (a dev cluster's manager does).

// Inflight is the number of requests the server is answering.
func (s *Server) Inflight() int64 { return s.inflight.Load() }

// HTTPHandler is the HTTP front's handler.
func (s *Server) HTTPHandler() http.Handler { return s.http.Handler }

// Health is the gRPC health service, called in process.
func (s *Server) Health() healthpb.HealthServer { return healthService{s: s} }
