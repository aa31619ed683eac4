// Package deploy holds no Go code: it is where deployment material lives
// (systemd units in deploy/systemd, topology notes in deploy/README.md).
// Kubernetes manifests and container builds come with the production
// topology work.
package deploy
