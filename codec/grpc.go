package codec

import (
	"fmt"

	"google.golang.org/grpc/encoding"
)

// GRPCCodecName is the gRPC content-subtype under which Cumulus frames
// travel: calls made with grpc.CallContentSubtype(GRPCCodecName) carry
// Frame bytes as they are, without protobuf.
const GRPCCodecName = "cumulus"

// Frame is an encoded Cumulus message (a lookup request or response).
type Frame []byte

type grpcCodec struct{}

func (grpcCodec) Name() string { return GRPCCodecName }

func (grpcCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*Frame)
	if !ok {
		return nil, fmt.Errorf("codec: grpc: cannot marshal %T, want *codec.Frame", v)
	}
	return *f, nil
}

// Unmarshal keeps data: gRPC hands v1 codecs a copy of its own.
func (grpcCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("codec: grpc: cannot unmarshal into %T, want *codec.Frame", v)
	}
	*f = data
	return nil
}

func init() { encoding.RegisterCodec(grpcCodec{}) }
