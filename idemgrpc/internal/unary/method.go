package unary

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// MethodConfig is how one covered method takes its key.
type MethodConfig struct {
	Required bool
	KeyField string
}

// A Method is a covered method, checked against its descriptor.
type Method struct {
	// Name is the full method name, "/package.Service/Method".
	Name string
	// Service is the full service name, "package.Service": the domain of
	// the ErrorInfo details of the interceptor's own answers by default.
	Service string
	// Required makes the key mandatory.
	Required bool

	keyField protoreflect.Name     // "" when the key comes from metadata only
	output   protoreflect.FullName // the response type a replay must have
}

// resolveMethod checks name and mc against the method's descriptor in the
// global registry, where generated code registers every service it holds.
func resolveMethod(name string, mc MethodConfig) (*Method, error) {
	svc, meth, ok := splitMethod(name)
	if !ok {
		return nil, fmt.Errorf("method %q is not a full method name of the form /package.Service/Method", name)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("method %q: service %s is not registered (is its generated package linked in?)", name, svc)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("method %q: %s is not a service", name, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(meth))
	if md == nil {
		return nil, fmt.Errorf("method %q: service %s has no method %s", name, svc, meth)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("method %q is a streaming method; only unary methods can be covered", name)
	}
	m := &Method{Name: name, Service: svc, Required: mc.Required, output: md.Output().FullName()}
	if mc.KeyField != "" {
		fd := md.Input().Fields().ByName(protoreflect.Name(mc.KeyField))
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
			return nil, fmt.Errorf("method %q: KeyField %q is not a singular string field of %s", name, mc.KeyField, md.Input().FullName())
		}
		m.keyField = fd.Name()
	}
	return m, nil
}

// splitMethod splits "/package.Service/Method" into its service and method.
func splitMethod(name string) (svc, meth string, ok bool) {
	rest, ok := strings.CutPrefix(name, "/")
	if !ok {
		return "", "", false
	}
	svc, meth, ok = strings.Cut(rest, "/")
	if !ok || svc == "" || meth == "" || strings.Contains(meth, "/") ||
		!protoreflect.FullName(svc).IsValid() || !protoreflect.Name(meth).IsValid() {
		return "", "", false
	}
	return svc, meth, true
}
