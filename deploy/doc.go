// Package deploy holds no Go code: it is where deployment material lives
// (Kubernetes manifests in deploy/kubernetes, checked by cmd/cumulus's
// TestKubernetesManifests, which also reads the Dockerfile; systemd units
// in deploy/systemd, checked by TestSystemdUnits; the walkthrough in
// deploy/README.md).
package deploy
