// Package deploy holds no Go code: it is where deployment material lives
// (systemd units in deploy/systemd, checked by cmd/cumulus's
// TestSystemdUnits; topology notes in deploy/README.md). Kubernetes
// manifests and a container build are still to come.
package deploy
