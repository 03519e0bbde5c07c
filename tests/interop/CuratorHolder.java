// Interop peer for zkgate's outage tests: an Apache Curator InterProcessMutex holder that takes
// and gives back the lock in a loop on its own, and says each time when it believed it held it.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorHolder <connectString> <lockPath> <holdMillis>
//
// stdout (one line each, flushed; times in microseconds since the epoch, the clock the test
// reads too):
//   READY                      once the client is connected
//   HELD <from> <to> <how>     one hold: from the moment acquire() returned to the moment the
//                              holder stopped believing it held the lock. <how> is `released`
//                              (it gave the lock back) or `suspended` (the connection was lost
//                              while it held: Curator's rule, a lock is not to be trusted
//                              through SUSPENDED, so the hold ends when the state is seen)
//   STATE <name> <micros>      each connection state change, for the test's report
//   BYE                        after the last hold, on "quit" or EOF on stdin
//
// The hold lasts between holdMillis/2 and 3*holdMillis/2. An acquire that fails (the ensemble
// away) is tried again after 100 ms, as a client would.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorHolder {
    private static PrintStream proto;

    private static synchronized void say(String line) {
        proto.println(line);
        proto.flush();
    }

    private static long micros() {
        return ChronoUnit.MICROS.between(Instant.EPOCH, Instant.now());
    }

    public static void main(String[] args) throws Exception {
        proto = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 3) {
            say("ERROR usage: CuratorHolder <connectString> <lockPath> <holdMillis>");
            System.exit(1);
        }
        long hold = Long.parseLong(args[2]);
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        // When the connection was lost (SUSPENDED or LOST), each time, as the listener heard it.
        ConcurrentLinkedQueue<Long> losses = new ConcurrentLinkedQueue<>();
        AtomicBoolean connected = new AtomicBoolean(true);
        client.getConnectionStateListenable().addListener((c, state) -> {
            long now = micros();
            if (state.isConnected()) {
                connected.set(true);
            } else if (connected.getAndSet(false)) {
                losses.add(now);
            }
            say("STATE " + state + " " + now);
        });
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0] + " within 30s");
            System.exit(1);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        Thread reader = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("quit")) {
                    // nothing else is understood
                }
            } catch (Exception e) {
                // EOF or a broken pipe: stop as on quit
            }
        });
        reader.start();
        say("READY");

        while (reader.isAlive()) {
            boolean acquired;
            try {
                acquired = mutex.acquire(2, TimeUnit.SECONDS);
            } catch (Exception e) {
                Thread.sleep(100); // the ensemble is away: try again, as a client would
                continue;
            }
            if (!acquired) {
                continue;
            }
            long from = micros();
            boolean connectedAtStart = connected.get();
            long millis = ThreadLocalRandom.current().nextLong(hold / 2, hold * 3 / 2 + 1);
            Thread.sleep(millis); // the critical section
            long to = micros();
            String how = "released";
            if (!connectedAtStart) {
                to = from; // acquire() returned while the connection was down: never trusted
                how = "suspended";
            } else {
                // Lost while held (and perhaps back since): the hold ended when the first loss
                // was heard.
                for (long at : losses) {
                    if (at >= from && at < to) {
                        to = at;
                        how = "suspended";
                    }
                }
            }
            say("HELD " + from + " " + to + " " + how);
            try {
                mutex.release();
            } catch (Exception e) {
                // The node goes with the session, or Curator's guaranteed delete removes it.
                System.err.println("release failed: " + e);
            }
        }
        say("BYE");
        client.close();
        System.exit(0);
    }
}
