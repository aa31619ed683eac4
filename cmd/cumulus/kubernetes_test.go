package main

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cmv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// kube is deploy/kubernetes rendered by kustomize, each document decoded
// into its Go type.
type kube struct {
	namespace    string
	namespaces   []*corev1.Namespace
	configMaps   map[string]*corev1.ConfigMap
	services     map[string]*corev1.Service
	claims       map[string]*corev1.PersistentVolumeClaim
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	autoscalers  []*autoscalingv2.HorizontalPodAutoscaler
	budgets      []*policyv1.PodDisruptionBudget
	certificates map[string]*cmv1.Certificate
	issuers      map[string]*cmv1.Issuer
}

// operatorSecrets are the Secrets deploy/README.md has the operator make
// (nothing in the manifests produces them), with the keys it names.
var operatorSecrets = map[string][]string{
	"cumulus-admin-token": {"token"},
	"cumulus-push-token":  {"token"},
	"cumulus-etcd-client": {"tls.crt", "tls.key", "ca.crt"},
}

// strict decodes one rendered document into v, refusing unknown,
// duplicate and wrongly cased fields as the API server's strict field
// validation does.
func strict(t *testing.T, what string, doc []byte, v any) {
	t.Helper()
	strictErrs, err := kjson.UnmarshalStrict(doc, v)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, e := range strictErrs {
		t.Errorf("%s: %v", what, e)
	}
}

// decodeAs is strict's decoding into a new T.
func decodeAs[T any](t *testing.T, what string, doc []byte) *T {
	t.Helper()
	v := new(T)
	strict(t, what, doc, v)
	return v
}

// renderKube runs kustomize (its Go API, as `kubectl apply -k` does) on
// dir and decodes every document; a kind it does not know fails.
func renderKube(t *testing.T, dir string) *kube {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	k := &kube{configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{},
		claims: map[string]*corev1.PersistentVolumeClaim{}, statefulSets: map[string]*appsv1.StatefulSet{},
		deployments: map[string]*appsv1.Deployment{}, certificates: map[string]*cmv1.Certificate{}, issuers: map[string]*cmv1.Issuer{}}
	for _, r := range m.Resources() {
		doc, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		what := r.GetApiVersion() + " " + r.GetKind() + " " + r.GetName()
		if ns := r.GetNamespace(); r.GetKind() != "Namespace" {
			if ns == "" || k.namespace != "" && ns != k.namespace {
				t.Fatalf("%s: namespace %q (others: %q)", what, ns, k.namespace)
			}
			k.namespace = ns
		}
		switch r.GetApiVersion() + " " + r.GetKind() {
		case "v1 Namespace":
			k.namespaces = append(k.namespaces, decodeAs[corev1.Namespace](t, what, doc))
		case "v1 ConfigMap":
			k.configMaps[r.GetName()] = decodeAs[corev1.ConfigMap](t, what, doc)
		case "v1 Service":
			k.services[r.GetName()] = decodeAs[corev1.Service](t, what, doc)
		case "v1 PersistentVolumeClaim":
			k.claims[r.GetName()] = decodeAs[corev1.PersistentVolumeClaim](t, what, doc)
		case "apps/v1 StatefulSet":
			k.statefulSets[r.GetName()] = decodeAs[appsv1.StatefulSet](t, what, doc)
		case "apps/v1 Deployment":
			k.deployments[r.GetName()] = decodeAs[appsv1.Deployment](t, what, doc)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			k.autoscalers = append(k.autoscalers, decodeAs[autoscalingv2.HorizontalPodAutoscaler](t, what, doc))
		case "policy/v1 PodDisruptionBudget":
			k.budgets = append(k.budgets, decodeAs[policyv1.PodDisruptionBudget](t, what, doc))
		case "cert-manager.io/v1 Certificate":
			k.certificates[r.GetName()] = decodeAs[cmv1.Certificate](t, what, doc)
		case "cert-manager.io/v1 Issuer":
			k.issuers[r.GetName()] = decodeAs[cmv1.Issuer](t, what, doc)
		default:
			t.Fatalf("%s: a kind this test does not check", what)
		}
	}
	return k
}

// workload is a StatefulSet's or Deployment's pod as the test reads it.
type workload struct {
	kind, name string
	pod        *corev1.PodTemplateSpec
	podName    string // a name Kubernetes gives one of its pods
	claims     []corev1.PersistentVolumeClaim
}

func (k *kube) workloads() []workload {
	var w []workload
	for _, s := range k.statefulSets {
		w = append(w, workload{"StatefulSet", s.Name, &s.Spec.Template, s.Name + "-0", s.Spec.VolumeClaimTemplates})
	}
	for _, d := range k.deployments {
		w = append(w, workload{"Deployment", d.Name, &d.Spec.Template, d.Name + "-5d8f7c9b6-x2x7q", nil})
	}
	slices.SortFunc(w, func(a, b workload) int { return strings.Compare(a.name, b.name) })
	return w
}

// selects is the one workload whose pods sel picks (nil, and an error,
// when none or several).
func (k *kube) selects(t *testing.T, what string, sel map[string]string) *workload {
	t.Helper()
	var found []workload
	for _, w := range k.workloads() {
		if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(w.pod.Labels)) {
			found = append(found, w)
		}
	}
	if len(found) != 1 {
		t.Errorf("%s: selector %v picks %d workloads", what, sel, len(found))
		return nil
	}
	return &found[0]
}

// envValue is what Kubernetes sets an env entry to in pod podName.
func (k *kube) envValue(t *testing.T, where string, e corev1.EnvVar, podName string) string {
	t.Helper()
	switch src := e.ValueFrom; {
	case src == nil:
		return e.Value
	case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.name":
		return podName
	case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.namespace":
		return k.namespace
	case src.FieldRef != nil && src.FieldRef.FieldPath == "spec.nodeName":
		return "ip-10-0-12-34.eu-west-1.compute.internal"
	case src.ResourceFieldRef != nil && src.ResourceFieldRef.Resource == "requests.cpu":
		return "2"
	case src.ConfigMapKeyRef != nil:
		cm := k.configMaps[src.ConfigMapKeyRef.Name]
		if cm == nil {
			t.Errorf("%s: env %s: no ConfigMap %s", where, e.Name, src.ConfigMapKeyRef.Name)
			return ""
		}
		v, ok := cm.Data[src.ConfigMapKeyRef.Key]
		if !ok {
			t.Errorf("%s: env %s: ConfigMap %s has no key %s", where, e.Name, cm.Name, src.ConfigMapKeyRef.Key)
		}
		return v
	}
	t.Errorf("%s: env %s: a source this test does not know", where, e.Name)
	return ""
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandArgs is the container's args as the process receives them:
// $(VAR) replaced by its env entry's value (Kubernetes leaves an unknown
// one as it is, which the test refuses).
func expandArgs(t *testing.T, where string, args []string, env map[string]string) []string {
	t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := ref[2 : len(ref)-1]
			v, ok := env[name]
			if !ok {
				t.Errorf("%s: %q names $(%s), which the container's env does not set", where, a, name)
			}
			return v
		})
	}
	return out
}

// helpText is `cumulus CMD --help`, asked once per command.
type helpText map[string]string

func (h helpText) of(t *testing.T, cmd string) string {
	t.Helper()
	if h[cmd] == "" {
		out, err := cumulus(cmd, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("cumulus %s --help: %v\n%s", cmd, err, out)
		}
		h[cmd] = string(out)
	}
	return h[cmd]
}

// checkFlags checks a command line's flags (after the command) against
// the binary: each exists in its --help, and each address flag is a
// host and a port. It returns them by name ("--flag VALUE" and
// "--flag=VALUE" both read).
func checkFlags(t *testing.T, where, cmd string, args []string, help helpText) map[string]string {
	t.Helper()
	text := help.of(t, cmd)
	flags := map[string]string{}
	for i := 0; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "--") {
			t.Fatalf("%s: %q is not a flag", where, args[i])
		}
		f, v, eq := strings.Cut(args[i], "=")
		if !eq && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			v, i = args[i+1], i+1
		}
		if _, dup := flags[f]; dup {
			t.Errorf("%s: %s given twice", where, f)
		}
		flags[f] = v
		if !strings.Contains(text, "      "+f+" ") && !strings.Contains(text, ", "+f+" ") {
			t.Errorf("%s: cumulus %s has no flag %s", where, cmd, f)
		}
		if addrFlags[f] {
			if _, err := portOf(v); err != nil {
				t.Errorf("%s: %s %s: %v", where, f, v, err)
			}
		}
	}
	return flags
}

func portOf(addr string) (int, error) {
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.Atoi(port)
	if err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("not an address with a host and a port")
	}
	return p, nil
}

// plainHTTP is, for each command, the flags whose address serves plain
// HTTP whatever the TLS flags (kubelet's probes present no certificate),
// with the paths served there (adminhttp.HandleProbes registers them).
var plainHTTP = map[string]map[string][]string{
	"shard":   {"--probe-addr": {"/healthz", "/readyz", "/metrics"}},
	"router":  {"--probe-addr": {"/healthz", "/readyz", "/metrics"}},
	"manager": {"--probe-addr": {"/healthz", "/readyz", "/metrics"}},
}

// fileFlags are the flags naming a file or directory in the container.
var fileFlags = []string{"--repo", "--data-dir", "--tls-cert", "--tls-key", "--tls-ca", "--client-ca",
	"--etcd-cert", "--etcd-key", "--etcd-ca", "--admin-token-file", "--push-token-file"}

// TestKubernetesManifests renders deploy/kubernetes with kustomize,
// decodes every document strictly into its Go type (k8s.io/api,
// cert-manager's API) and checks what would otherwise only fail on a
// cluster: every flag exists in the binary, probes reach a port and a
// path the binary serves in plain HTTP, Services and budgets select a
// workload and name its ports, every file a flag names is in a mounted
// volume from a Secret or claim something produces, the certificates
// cover the names peers dial (in the rendered namespace), the drain ends
// before SIGKILL, and the pods run as the image's non-root user with a
// read-only root.
func TestKubernetesManifests(t *testing.T) {
	k := renderKube(t, "../../deploy/kubernetes")
	if len(k.namespaces) != 1 || k.namespaces[0].Name != k.namespace {
		t.Fatalf("namespaces %v; the objects are in %q", k.namespaces, k.namespace)
	}
	if l := k.namespaces[0].Labels["pod-security.kubernetes.io/enforce"]; l != "restricted" {
		t.Errorf("namespace %s enforces pod security %q, want restricted", k.namespace, l)
	}
	// The model repository's claim is applied on its own (kubectl delete
	// -k must leave it), in the same namespace.
	doc, err := os.ReadFile("../../deploy/kubernetes/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if doc, err = yaml.YAMLToJSON(doc); err != nil {
		t.Fatal(err)
	}
	var models corev1.PersistentVolumeClaim
	strict(t, "models.yaml", doc, &models)
	if models.Namespace != k.namespace || !slices.Contains(models.Spec.AccessModes, corev1.ReadWriteMany) {
		t.Errorf("models.yaml: claim %s in %q, modes %v: want ReadWriteMany in %q", models.Name, models.Namespace, models.Spec.AccessModes, k.namespace)
	}
	if k.claims[models.Name] != nil {
		t.Errorf("the claim %s is in the kustomization: kubectl delete -k would delete the models", models.Name)
	}
	k.claims[models.Name] = &models
	help := helpText{}
	image := dockerfileImage(t, "../../Dockerfile")
	roles := map[string]workload{}
	roleFlags := map[string]map[string]string{}
	for _, w := range k.workloads() {
		where := w.kind + " " + w.name
		pod := &w.pod.Spec
		if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
			t.Fatalf("%s: %d containers, %d init containers", where, len(pod.Containers), len(pod.InitContainers))
		}
		c := pod.Containers[0]
		if len(c.Command) != 0 || len(c.Args) < 2 {
			t.Fatalf("%s: command %q args %q: the image's entrypoint is cumulus, args its command line", where, c.Command, c.Args)
		}
		cmd := c.Args[0]
		if _, ok := plainHTTP[cmd]; !ok {
			t.Fatalf("%s: runs cumulus %q", where, cmd)
		}
		if _, dup := roles[cmd]; dup {
			t.Fatalf("%s: a second workload for %s", where, cmd)
		}
		roles[cmd] = w
		if !strings.HasPrefix(c.Image, "ghcr.io/cumulus-serving/cumulus:") {
			t.Errorf("%s: image %q is not the one kustomization.yaml names", where, c.Image)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = k.envValue(t, where, e, w.podName)
		}
		flags := checkFlags(t, where, cmd, expandArgs(t, where, c.Args[1:], env), help)
		roleFlags[cmd] = flags

		// Ports: each container port is one the process listens on;
		// each probe reaches a plain-HTTP port at a path served there.
		listens := map[int]string{}
		for f, v := range flags {
			if addrFlags[f] && !advertiseFlags[f] {
				p, _ := portOf(v)
				listens[p] = f
				if host, _, _ := net.SplitHostPort(v); host != "0.0.0.0" && host != "::" {
					t.Errorf("%s: %s %s: a pod must listen on every address", where, f, v)
				}
			}
		}
		ports := map[string]int{}
		for _, p := range c.Ports {
			if listens[int(p.ContainerPort)] == "" {
				t.Errorf("%s: container port %d (%s) is none the process listens on (%v)", where, p.ContainerPort, p.Name, listens)
			}
			ports[p.Name] = int(p.ContainerPort)
		}
		probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
		for kind, p := range probes {
			if p == nil {
				if kind != "startup" {
					t.Errorf("%s: no %s probe", where, kind)
				}
				continue
			}
			if p.HTTPGet == nil {
				t.Errorf("%s: %s probe is not an HTTP GET (the image has no shell for exec)", where, kind)
				continue
			}
			port := portNumber(p.HTTPGet.Port, ports)
			flag := listens[port]
			if !slices.Contains(plainHTTP[cmd][flag], p.HTTPGet.Path) || p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
				t.Errorf("%s: %s probe GET %s on port %v (%s): cumulus %s serves plain HTTP %v", where, kind, p.HTTPGet.Path, p.HTTPGet.Port, flag, cmd, plainHTTP[cmd])
			}
			if kind == "liveness" && p.HTTPGet.Path != "/healthz" {
				t.Errorf("%s: liveness on %s: it must not wait for readiness (loading, a standby manager)", where, p.HTTPGet.Path)
			}
			if kind == "readiness" && p.HTTPGet.Path != "/readyz" {
				t.Errorf("%s: readiness on %s", where, p.HTTPGet.Path)
			}
		}
		if a := w.pod.Annotations; a["prometheus.io/scrape"] == "true" {
			p, _ := strconv.Atoi(a["prometheus.io/port"])
			if !slices.Contains(plainHTTP[cmd][listens[p]], a["prometheus.io/path"]) {
				t.Errorf("%s: scraped at %s on port %s, not a plain-HTTP metrics address", where, a["prometheus.io/path"], a["prometheus.io/port"])
			}
		}

		// Files: every path a flag names lies in a mount; secrets come
		// from a Certificate or the operator, with the key the file is.
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = m
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			volumes[v.Name] = v
		}
		claims := map[string]bool{}
		for _, c := range w.claims {
			claims[c.Name] = true
		}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			switch {
			case claims[m.Name]:
			case !ok:
				t.Errorf("%s: mount %s: no volume %s", where, m.MountPath, m.Name)
			case v.Secret != nil:
				if !m.ReadOnly {
					t.Errorf("%s: secret %s mounted writable", where, v.Secret.SecretName)
				}
				if k.secretKeys(v.Secret.SecretName) == nil {
					t.Errorf("%s: secret %s: no Certificate makes it and the operator is not told to", where, v.Secret.SecretName)
				}
			case v.PersistentVolumeClaim != nil:
				if k.claims[v.PersistentVolumeClaim.ClaimName] == nil {
					t.Errorf("%s: claim %s is not in the manifests", where, v.PersistentVolumeClaim.ClaimName)
				}
			case v.EmptyDir != nil:
			default:
				t.Errorf("%s: volume %s: a source this test does not know", where, m.Name)
			}
		}
		for _, f := range fileFlags {
			p, ok := flags[f]
			if !ok {
				continue
			}
			m, ok := mounts[path.Dir(p)]
			if f == "--repo" || f == "--data-dir" {
				m, ok = mounts[p]
			}
			if !ok {
				t.Errorf("%s: %s %s is in no volume mount", where, f, p)
				continue
			}
			v := volumes[m.Name]
			switch {
			case f == "--data-dir":
				if !claims[m.Name] || m.ReadOnly {
					t.Errorf("%s: --data-dir on %s: it needs a writable volume of its own that outlives the pod (a volumeClaimTemplate)", where, m.Name)
				}
			case f == "--repo":
				if v.PersistentVolumeClaim == nil || cmd == "manager" && (m.ReadOnly || v.PersistentVolumeClaim.ReadOnly) {
					t.Errorf("%s: --repo on %s: the shared claim (writable for the manager, which prunes)", where, m.Name)
				}
			case v.Secret == nil:
				t.Errorf("%s: %s %s is not in a Secret", where, f, p)
			case !slices.Contains(k.secretKeys(v.Secret.SecretName), path.Base(p)):
				t.Errorf("%s: %s %s: secret %s holds %v", where, f, p, v.Secret.SecretName, k.secretKeys(v.Secret.SecretName))
			}
		}
		if flags["--etcd-cert"] != "" && !strings.HasPrefix(flags["--etcd"], "https://") {
			t.Errorf("%s: etcd client TLS with --etcd %q (cumulus refuses http:// with TLS)", where, flags["--etcd"])
		}
		if cmd == "manager" && flags["--admin-token-file"] == "" {
			t.Errorf("%s: a manager needs --admin-token-file", where)
		}
		if flags["--tls-cert"] == "" {
			t.Errorf("%s: no --tls-cert: mutual TLS between every part", where)
		}

		// Stopping: the drain (and a preStop wait) ends before SIGKILL.
		drain := 20 * time.Second // --drain-timeout's default
		if v, ok := flags["--drain-timeout"]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: --drain-timeout %q", where, v)
			}
			drain = d
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			if c.Lifecycle.PreStop.Sleep == nil {
				t.Errorf("%s: preStop is not a sleep action (the image has no shell)", where)
			} else {
				drain += time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
			}
		}
		grace := 30 * time.Second // Kubernetes' default
		if g := pod.TerminationGracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		if cmd != "manager" && grace <= drain {
			t.Errorf("%s: terminationGracePeriodSeconds %v is not above the drain and preStop (%v)", where, grace, drain)
		}

		// Security: restricted, as the image's non-root user.
		sc := pod.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || strconv.FormatInt(*sc.RunAsUser, 10) != image.user ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod securityContext %+v: non-root as the image's user %s, RuntimeDefault seccomp", where, sc, image.user)
		}
		for _, m := range c.VolumeMounts {
			v := volumes[m.Name]
			if !m.ReadOnly && v.EmptyDir == nil && (sc == nil || sc.FSGroup == nil || strconv.FormatInt(*sc.FSGroup, 10) != image.user) {
				t.Errorf("%s: %s is mounted writable, but the pod's fsGroup does not give it to the image's user %s", where, m.MountPath, image.user)
			}
		}
		if cs := c.SecurityContext; cs != nil && cs.SeccompProfile != nil && cs.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: container seccomp %s", where, cs.SeccompProfile.Type)
		}
		if cs := c.SecurityContext; cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
			cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: container securityContext %+v: no privilege escalation, read-only root, no capabilities", where, cs)
		}
		if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			t.Errorf("%s: no memory limit", where)
		} else if b, ok := flags["--memory-budget"]; ok {
			var budget byteSize
			if err := budget.Set(b); err != nil || int64(budget) >= mem.Value() {
				t.Errorf("%s: --memory-budget %s is not below the memory limit %s (%v)", where, b, mem.String(), budget.Set(b))
			}
		}
		if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
			t.Errorf("%s: no CPU request (the autoscaler and the scheduler need one)", where)
		}
	}

	// The roles and what ties them together.
	shard, router, manager := roles["shard"], roles["router"], roles["manager"]
	if shard.kind != "StatefulSet" || manager.kind != "StatefulSet" || router.kind != "Deployment" {
		t.Fatalf("shard %s, router %s, manager %s: want StatefulSet, Deployment, StatefulSet", shard.kind, router.kind, manager.kind)
	}
	if r := k.statefulSets[manager.name].Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("managers: %v replicas, want 3", r)
	}
	shards := k.statefulSets[shard.name]
	if shards.Spec.Replicas == nil || shards.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType ||
		shards.Spec.PodManagementPolicy == appsv1.ParallelPodManagement {
		t.Errorf("shards: replicas %v, updates %s, pods %s: want a count, OnDelete (restarted by the procedure that waits for every replica) and one at a time",
			shards.Spec.Replicas, shards.Spec.UpdateStrategy.Type, shards.Spec.PodManagementPolicy)
	}
	if r := k.deployments[router.name].Spec.Replicas; r != nil {
		t.Errorf("routers: replicas %d in the Deployment: every kubectl apply would undo the autoscaler's count", *r)
	}
	// Shards are dialed by the name the headless Service gives the pod, on
	// the port they listen on.
	adv, advPort, _ := net.SplitHostPort(roleFlags["shard"]["--advertise"])
	_, lisPort, _ := net.SplitHostPort(roleFlags["shard"]["--addr"])
	if want := shard.podName + "." + shards.Spec.ServiceName + "." + k.namespace + ".svc.cluster.local"; adv != want || advPort != lisPort {
		t.Errorf("shards advertise %s, want %s:%s (the pod's name under its headless Service, the port it listens on)", roleFlags["shard"]["--advertise"], want, lisPort)
	}
	// Managers: a raft group bootstrapped from the StatefulSet's pods, each
	// advertising its name under the headless Service, on the port it
	// listens on, with its own volume for the log.
	mgrs := k.statefulSets[manager.name]
	mf := roleFlags["manager"]
	_, raftPort, _ := net.SplitHostPort(mf["--raft-addr"])
	podAddr := func(i int) string {
		return fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local:%s", mgrs.Name, i, mgrs.Spec.ServiceName, k.namespace, raftPort)
	}
	if mf["--raft-id"] != manager.podName || mf["--raft-advertise"] != podAddr(0) {
		t.Errorf("managers: --raft-id %s --raft-advertise %s, want the pod's name and %s", mf["--raft-id"], mf["--raft-advertise"], podAddr(0))
	}
	var wantPeers []string
	for i := range int(*mgrs.Spec.Replicas) {
		wantPeers = append(wantPeers, fmt.Sprintf("%s-%d=%s", mgrs.Name, i, podAddr(i)))
	}
	if mf["--raft-peers"] != strings.Join(wantPeers, ",") {
		t.Errorf("managers: --raft-peers %s, want %s", mf["--raft-peers"], strings.Join(wantPeers, ","))
	}
	if dir := mf["--raft-dir"]; !slices.ContainsFunc(manager.pod.Spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
		return strings.HasPrefix(dir+"/", m.MountPath+"/") && slices.ContainsFunc(manager.claims, func(c corev1.PersistentVolumeClaim) bool { return c.Name == m.Name })
	}) {
		t.Errorf("managers: --raft-dir %s is not on a volume of the pod's own (a volumeClaimTemplate)", dir)
	}
	// Each role's serving ports are behind a Service.
	for role, names := range map[string][]string{"shard": {"grpc"}, "router": {"grpc", "http"}, "manager": {"admin"}} {
		for _, name := range names {
			if !slices.ContainsFunc(slices.Collect(maps.Values(k.services)), func(svc *corev1.Service) bool {
				return labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(roles[role].pod.Labels)) &&
					slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.TargetPort.StrVal == name })
			}) {
				t.Errorf("%s: no Service exposes its %s port", role, name)
			}
		}
	}
	for _, s := range k.statefulSets {
		svc := k.services[s.Spec.ServiceName]
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("StatefulSet %s: service %q must be headless and publish pods before they are ready (a loading shard is dialled by name)", s.Name, s.Spec.ServiceName)
		}
	}
	for name, svc := range k.services {
		w := k.selects(t, "Service "+name, svc.Spec.Selector)
		if w == nil {
			continue
		}
		for _, p := range svc.Spec.Ports {
			ports := map[string]int{}
			for _, cp := range w.pod.Spec.Containers[0].Ports {
				ports[cp.Name] = int(cp.ContainerPort)
			}
			if portNumber(p.TargetPort, ports) == 0 {
				t.Errorf("Service %s: port %s targets %v, which %s does not expose", name, p.Name, p.TargetPort.String(), w.name)
			}
		}
	}
	for _, b := range k.budgets {
		if w := k.selects(t, "PodDisruptionBudget "+b.Name, b.Spec.Selector.MatchLabels); w != nil && (b.Spec.MaxUnavailable == nil || b.Spec.MaxUnavailable.IntValue() != 1) {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, want 1", b.Name, b.Spec.MaxUnavailable)
		}
	}
	if len(k.budgets) != 3 {
		t.Errorf("%d PodDisruptionBudgets, want one per role", len(k.budgets))
	}
	if len(k.autoscalers) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers, want the routers'", len(k.autoscalers))
	}
	hpa := k.autoscalers[0]
	if lo := hpa.Spec.MinReplicas; lo == nil || *lo < 2 || hpa.Spec.MaxReplicas < *lo {
		t.Errorf("HorizontalPodAutoscaler %s: min %v max %d: want at least 2, max no less", hpa.Name, ptrString(lo), hpa.Spec.MaxReplicas)
	}
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != router.name || len(hpa.Spec.Metrics) != 1 ||
		hpa.Spec.Metrics[0].Resource == nil || hpa.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
		t.Errorf("HorizontalPodAutoscaler %s: %+v, want the routers on CPU", hpa.Name, hpa.Spec)
	}

	// Certificates: issued by an issuer in the manifests, for the names
	// peers dial, good for both ends of mutual TLS.
	known := []cmv1.KeyUsage{cmv1.UsageSigning, cmv1.UsageDigitalSignature, cmv1.UsageContentCommitment, cmv1.UsageKeyEncipherment,
		cmv1.UsageKeyAgreement, cmv1.UsageDataEncipherment, cmv1.UsageCertSign, cmv1.UsageCRLSign, cmv1.UsageEncipherOnly,
		cmv1.UsageDecipherOnly, cmv1.UsageAny, cmv1.UsageServerAuth, cmv1.UsageClientAuth, cmv1.UsageCodeSigning,
		cmv1.UsageEmailProtection, cmv1.UsageSMIME, cmv1.UsageIPsecEndSystem, cmv1.UsageIPsecTunnel, cmv1.UsageIPsecUser,
		cmv1.UsageTimestamping, cmv1.UsageOCSPSigning, cmv1.UsageMicrosoftSGC, cmv1.UsageNetscapeSGC}
	for name, c := range k.certificates {
		for _, u := range c.Spec.Usages {
			if !slices.Contains(known, u) {
				t.Errorf("Certificate %s: usage %q is none cert-manager knows", name, u)
			}
		}
		if c.Spec.IsCA {
			if iss := k.issuers[c.Spec.IssuerRef.Name]; iss == nil || iss.Spec.SelfSigned == nil {
				t.Errorf("Certificate %s: a CA issued by %s, not a self-signed issuer", name, c.Spec.IssuerRef.Name)
			}
		} else if !slices.Contains(c.Spec.Usages, cmv1.UsageClientAuth) {
			t.Errorf("Certificate %s: usages %v: every certificate here is some client's", name, c.Spec.Usages)
		}
		iss := k.issuers[c.Spec.IssuerRef.Name]
		if c.Spec.IssuerRef.Kind != "Issuer" || iss == nil {
			t.Errorf("Certificate %s: issuer %+v is not in the manifests", name, c.Spec.IssuerRef)
		} else if iss.Spec.CA != nil && !slices.ContainsFunc(slices.Collect(maps.Values(k.certificates)), func(ca *cmv1.Certificate) bool {
			return ca.Spec.IsCA && ca.Spec.SecretName == iss.Spec.CA.SecretName
		}) {
			t.Errorf("Issuer %s: its CA secret %s comes from no CA Certificate", iss.Name, iss.Spec.CA.SecretName)
		}
	}
	dials := map[string][]string{
		"shard":  {hostOf(t, roleFlags["shard"]["--advertise"])},
		"router": {router.name, router.name + "." + k.namespace, router.name + "." + k.namespace + ".svc", router.name + "." + k.namespace + ".svc.cluster.local"},
		"manager": {manager.podName + "." + k.statefulSets[manager.name].Spec.ServiceName + "." + k.namespace + ".svc.cluster.local",
			manager.podName + "." + k.statefulSets[manager.name].Spec.ServiceName + "." + k.namespace + ".svc",
			k.statefulSets[manager.name].Spec.ServiceName, k.statefulSets[manager.name].Spec.ServiceName + "." + k.namespace + ".svc"},
	}
	for role, names := range dials {
		w := roles[role]
		secret := secretAt(w, path.Dir(roleFlags[role]["--tls-cert"]))
		var cert *cmv1.Certificate
		for _, c := range k.certificates {
			if c.Spec.SecretName == secret {
				cert = c
			}
		}
		if cert == nil {
			t.Errorf("%s: its TLS secret %q comes from no Certificate", role, secret)
			continue
		}
		checkCertRole(t, cert, roleFlags[role]["--cluster"], tlsconf.Role(role))
		leaf := x509.Certificate{DNSNames: cert.Spec.DNSNames}
		for _, n := range names {
			if err := leaf.VerifyHostname(n); err != nil {
				t.Errorf("Certificate %s: peers dial %s %s: %v", cert.Name, role, n, err)
			}
		}
		for _, u := range []cmv1.KeyUsage{cmv1.UsageServerAuth, cmv1.UsageClientAuth} {
			if !slices.Contains(cert.Spec.Usages, u) {
				t.Errorf("Certificate %s: usages %v lack %s", cert.Name, cert.Spec.Usages, u)
			}
		}
	}
	// The operators' client certificate (deploy/README.md) is an
	// operator's.
	if op := k.certificates["cumulus-operator"]; op == nil || op.Spec.SecretName != "cumulus-operator-tls" {
		t.Error("no Certificate cumulus-operator making cumulus-operator-tls")
	} else {
		checkCertRole(t, op, roleFlags["manager"]["--cluster"], tlsconf.RoleOperator)
	}
}

// checkCertRole checks that c names role in cluster, as its one SPIFFE
// ID, in a form tlsconf reads.
func checkCertRole(t *testing.T, c *cmv1.Certificate, cluster string, role tlsconf.Role) {
	t.Helper()
	leaf := &x509.Certificate{}
	for _, u := range c.Spec.URIs {
		p, err := url.Parse(u)
		if err != nil {
			t.Errorf("Certificate %s: URI SAN %q: %v", c.Name, u, err)
			return
		}
		leaf.URIs = append(leaf.URIs, p)
	}
	id, ok, err := tlsconf.IdentityOf(leaf)
	if err != nil || !ok || id.Role != role || id.Cluster != cluster {
		t.Errorf("Certificate %s: URIs %v (%+v, %v, %v); want the role %s of cluster %q", c.Name, c.Spec.URIs, id, ok, err, role, cluster)
	}
}

// TestCertificateRolesFollowTheCluster: the certificates' SPIFFE IDs
// take the cluster's name from the ConfigMap, so that changing it in one
// place changes both.
func TestCertificateRolesFollowTheCluster(t *testing.T) {
	dir := t.TempDir()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			if !strings.Contains(string(b), "- cluster=default\n") {
				t.Fatal("kustomization.yaml: no cluster=default line to change")
			}
			b = []byte(strings.Replace(string(b), "- cluster=default\n", "- cluster=prod-eu\n", 1))
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k := renderKube(t, dir)
	n := 0
	for name, c := range k.certificates {
		if c.Spec.IsCA {
			continue
		}
		n++
		checkCertRole(t, c, "prod-eu", tlsconf.Role(strings.TrimPrefix(name, "cumulus-")))
	}
	if n < 4 {
		t.Errorf("%d role certificates, want one per role at least (shard, router, manager, operator)", n)
	}
}

// secretAt is the Secret mounted at dir in w's container.
func secretAt(w workload, dir string) string {
	for _, m := range w.pod.Spec.Containers[0].VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	return ""
}

func hostOf(t *testing.T, addr string) string {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return host
}

// secretKeys is the keys a Secret will hold: a Certificate's (cert-manager
// writes tls.crt, tls.key and ca.crt) or the operator's; nil when nothing
// makes it.
func (k *kube) secretKeys(name string) []string {
	for _, c := range k.certificates {
		if c.Spec.SecretName == name {
			return []string{"tls.crt", "tls.key", "ca.crt"}
		}
	}
	return operatorSecrets[name]
}

// portNumber is a probe's or Service's port as a container port number
// (0 when it names none).
func portNumber(p intstr.IntOrString, named map[string]int) int {
	if p.Type == intstr.String {
		return named[p.StrVal]
	}
	for _, n := range named {
		if n == p.IntValue() {
			return n
		}
	}
	return 0
}

// dockerImage is what the Dockerfile's final stage sets.
type dockerImage struct {
	user string
}

// dockerfileImage reads the Dockerfile and checks the build it describes:
// two stages, the first on the Go go.mod names building a static binary
// of ./cmd/cumulus, the last on an image with no shell running that
// binary as a numeric non-root user. (No container runtime runs here.)
func dockerfileImage(t *testing.T, file string) dockerImage {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type stage struct {
		from, as string
		lines    []string
	}
	var stages []stage
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if strings.EqualFold(fields[0], "FROM") {
			s := stage{from: fields[1]}
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
				s.as = fields[3]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %q before FROM", file, line)
		}
		stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, line)
	}
	if len(stages) != 2 {
		t.Fatalf("%s: %d stages, want a build and the image", file, len(stages))
	}
	build, final := stages[0], stages[1]
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if goVersion == nil || build.from != "golang:"+string(goVersion[1]) {
		t.Errorf("%s: builds FROM %s; go.mod names go %s", file, build.from, goVersion[1])
	}
	var built, entry, user, copied string
	for _, l := range build.lines {
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build") {
			built = l
		}
	}
	if !strings.Contains(built, "CGO_ENABLED=0") || !strings.HasSuffix(built, "./cmd/cumulus") {
		t.Errorf("%s: build %q: a static (CGO_ENABLED=0) build of ./cmd/cumulus", file, built)
	}
	for _, l := range final.lines {
		switch fields := strings.Fields(l); strings.ToUpper(fields[0]) {
		case "USER":
			user, _, _ = strings.Cut(fields[1], ":")
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(l[len("ENTRYPOINT"):])), &argv); err != nil || len(argv) != 1 {
				t.Errorf("%s: %q: exec form (no shell), the binary alone", file, l)
			} else {
				entry = argv[0]
			}
		case "COPY":
			if len(fields) == 4 && fields[1] == "--from="+build.as {
				copied = fields[3]
			}
		case "RUN":
			t.Errorf("%s: %q in the final stage: it has no shell", file, l)
		}
	}
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && final.from != "scratch" {
		t.Errorf("%s: final stage FROM %s: want one with no shell (distroless/static or scratch)", file, final.from)
	}
	if uid, err := strconv.Atoi(user); err != nil || uid == 0 {
		t.Errorf("%s: USER %q: a numeric non-root user (Kubernetes' runAsNonRoot checks numbers)", file, user)
	}
	if entry == "" || entry != copied {
		t.Errorf("%s: ENTRYPOINT %q is not the binary copied from the build (%q)", file, entry, copied)
	}
	return dockerImage{user: user}
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
