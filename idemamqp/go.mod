module github.com/idemhq/idem/idemamqp

go 1.26.0

require (
	github.com/idemhq/idem v0.1.0
	github.com/rabbitmq/amqp091-go v1.17.0
)

require (
	github.com/jackc/pgerrcode v0.0.0-20250907135507-afb5586c32a6 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The root module is required at the release this module is tagged with;
// replace builds it, here, against the code beside it. A user's build ignores
// replace and takes the tagged release.
replace github.com/idemhq/idem => ../
