package ha_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/lab/chaos/ha"
)

// A row committed on the primary with a synchronous standby is still
// there after the primary's node is killed: the client reconnects through
// the same multi-host URL and finds it on the promoted standby.
func Example() {
	ctx := context.Background()
	c, err := ha.Start(ctx, ha.Config{Sync: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = conn.Exec(ctx, "CREATE TABLE claims (key text PRIMARY KEY); INSERT INTO claims VALUES ('k1')")
	conn.Close(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	f, err := c.KillPrimary(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("killed %s, promoted %s\n", f.Killed.Name, f.Promoted.Name)

	conn, err = pgx.Connect(ctx, c.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM claims WHERE key = 'k1'").Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("claims after the failover:", n)
	// Output:
	// killed node1, promoted node2
	// claims after the failover: 1
}
