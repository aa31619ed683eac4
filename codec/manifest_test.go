package codec

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/partition"
)

func validManifest() Manifest {
	size := PartitionFileSize(10, 1, EncFP32, DefaultBlockSize)
	sha := strings.Repeat("ab", 32)
	return Manifest{
		Format: 1, Name: "ctr", Version: 3, Kind: KindFull, Type: TypeLR,
		Partitions: 2, Hash: partition.HashName, Params: 20,
		Files: []File{
			{Partition: 0, Path: "part-00000.bin", Keys: 10, Size: size, SHA256: sha},
			{Partition: 1, Path: "part-00001.bin", Keys: 10, Size: size, SHA256: sha},
		},
	}
}

func TestManifestValidate(t *testing.T) {
	m := validManifest()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(m *Manifest){
		"format":        func(m *Manifest) { m.Format = 2 },
		"name":          func(m *Manifest) { m.Name = "../etc" },
		"version":       func(m *Manifest) { m.Version = 0 },
		"kind":          func(m *Manifest) { m.Kind = "partial" },
		"delta parent":  func(m *Manifest) { m.Kind = KindDelta },
		"type":          func(m *Manifest) { m.Type = "dnn" },
		"lr dim":        func(m *Manifest) { m.Dim = 4 },
		"hash":          func(m *Manifest) { m.Hash = "crc32" },
		"file count":    func(m *Manifest) { m.Files = m.Files[:1] },
		"file order":    func(m *Manifest) { m.Files[0].Partition = 1 },
		"escape":        func(m *Manifest) { m.Files[1].Path = "../../x" },
		"absolute":      func(m *Manifest) { m.Files[1].Path = "/etc/passwd" },
		"sha":           func(m *Manifest) { m.Files[0].SHA256 = "" },
		"size":          func(m *Manifest) { m.Files[0].Size++ },
		"params":        func(m *Manifest) { m.Params = 21 },
		"no partitions": func(m *Manifest) { m.Partitions = 0; m.Files = nil },
		"encoding":      func(m *Manifest) { m.Encoding = "bf16" },
	}
	for name, mutate := range cases {
		m := validManifest()
		m.Files = append([]File(nil), m.Files...)
		mutate(&m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: invalid manifest accepted", name)
		}
	}
}

func FuzzParseManifest(f *testing.F) {
	m := validManifest()
	b, _ := json.Marshal(m)
	f.Add(b)
	f.Add([]byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed manifest fails validation: %v", err)
		}
	})
}
